"""The agent against the real service: PostgreSQL, `coldbench server`, agents as processes."""

from __future__ import annotations

import hashlib
import json
import signal
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.stack import Stack, free_port, running_stack, stop_process
from tests.worker.conftest import git

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One server for this module's tests. A short lease: a long-poll of a stopped agent may
    still claim a job for nobody (the server cannot know the client left), and a killed
    agent's run must come back quickly; live agents heartbeat every second."""
    with running_stack(
        tmp_path_factory.mktemp("service"),
        settings={"COLDBENCH_LEASE_TTL_S": "4", "COLDBENCH_LEASE_POLL_S": "0.2"},
    ) as running:
        yield running


PIP_EDITABLE = ("{python}", "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", ".")


def write_config(
    path: Path,
    *,
    name: str,
    repositories: dict[str, tuple[str, list[str]]] | None = None,
    labels: tuple[str, ...] = (),
    command: tuple[str, ...] = PIP_EDITABLE,
) -> Path:
    """A worker.toml: repositories maps name -> (url, recipe names), every recipe `command`
    (default `pip install -e .`)."""
    lines = [
        f'name = "{name}"',
        f"labels = {json.dumps(list(labels))}",
        'state_dir = "state"',
        'allow_presets = ["micro", "tiny"]',
    ]
    for repo, (url, recipes) in (repositories or {}).items():
        lines += [f"[repositories.{repo}]", f'url = "{url}"', 'module = "mlx_lm"']
        for recipe in recipes:
            lines += [f"[repositories.{repo}.recipes.{recipe}]", f"command = {json.dumps(command)}"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _log(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_enrollment_and_refusals(service: Stack, tmp_path: Path) -> None:
    """Secret kept 0600; a job outside the allow-list never reaches the host; a recipe the host
    lacks (its worker.toml changed after enrollment) is refused by the worker itself."""
    config = write_config(
        tmp_path / "host-a" / "worker.toml",
        name="host-a",
        repositories={"forked": (str(tmp_path / "nowhere"), ["editable", "fast"])},
    )
    agent_log = tmp_path / "agent-a.log"
    agent = service.start_agent(config, token=service.enrollment_token("lab:test"), log=agent_log)
    secret_path = config.with_name("worker.secret")
    deadline = time.monotonic() + 60
    while not secret_path.exists():
        assert agent.poll() is None, _log(agent_log)
        assert time.monotonic() < deadline, _log(agent_log)
        time.sleep(0.2)
    assert stat.S_IMODE(secret_path.stat().st_mode) == 0o600
    assert json.loads(secret_path.read_text())["secret"].startswith("cbw_")

    # Outside the allow-list: the server refuses it at submission; no host ever sees it.
    outside = service.submit(
        {
            "adapter": "mlx-lm",
            "repository": "evil",
            "variants": [{"name": "x", "ref": "main"}],
            "contexts": [64],
        }
    )
    assert outside.status_code == 422, outside.text
    assert "does not allow repository 'evil'" in outside.text

    # The adapter is part of what registration reported: a server job for it is refused too.
    wrong_adapter = service.submit(
        {
            "adapter": "openai-server",
            "repository": "forked",
            "variants": [{"name": "x", "ref": "main"}],
            "contexts": [64],
        }
    )
    assert wrong_adapter.status_code == 422, wrong_adapter.text
    assert wrong_adapter.json()["field"] == "adapter"
    assert "drives forked with the mlx-lm adapter, not openai-server" in wrong_adapter.text

    # The host owner drops the `fast` recipe and restarts the agent (already enrolled): its
    # next lease request reports the new allow-list, and a job asking for `fast` is refused at
    # submission instead of failing on the host.
    spec = {
        "adapter": "mlx-lm",
        "repository": "forked",
        "variants": [{"name": "x", "ref": "main", "recipe": "fast"}],
        "contexts": [64],
        "rounds": 1,
    }
    stop_process(agent)
    assert service.submit(spec).status_code == 201  # the server still knows the old offer
    write_config(
        config,
        name="host-a",
        repositories={"forked": (str(tmp_path / "nowhere"), ["editable"])},
    )
    agent = service.start_agent(config, token=None, log=agent_log)
    deadline = time.monotonic() + 60
    while (refused := service.submit(spec)).status_code == 201:
        assert time.monotonic() < deadline, _log(agent_log)
        time.sleep(0.5)
    assert refused.status_code == 422, refused.text
    assert refused.json()["field"] == "variants.0.recipe"
    assert "host-a defines no recipe fast for forked" in refused.json()["detail"]
    # Nothing was ever cloned or built for a job the host cannot run.
    assert not (config.parent / "state" / "mirrors").exists()
    assert not (config.parent / "state" / "venvs").exists()
    assert agent.poll() is None
    assert stop_process(agent) == 0, _log(agent_log)


def test_the_host_refuses_a_recipe_it_does_not_define(tmp_path: Path) -> None:
    """Defense in depth: a job the server let through by mistake is still refused on the host,
    before anything is cloned."""
    from coldbench.evidence.contract.schemas import JobSpec
    from coldbench.worker.config import load_host_config
    from coldbench.worker.run import RunRefused, check_job

    config = load_host_config(
        write_config(
            tmp_path / "worker.toml",
            name="host-a",
            repositories={"forked": (str(tmp_path / "nowhere"), ["editable"])},
        )
    )
    spec = JobSpec.model_validate(
        {
            "adapter": "mlx-lm",
            "repository": "forked",
            "variants": [{"name": "x", "ref": "main", "recipe": "fast"}],
            "contexts": [64],
            "rounds": 3,
        }
    )
    with pytest.raises(RunRefused, match="recipe 'fast' is not defined for forked"):
        check_job(spec, config.repositories)


def test_registration_reports_adapters_and_recipes(tmp_path: Path) -> None:
    from coldbench.worker.agent import repository_offers
    from coldbench.worker.config import load_host_config

    config = load_host_config(
        write_config(
            tmp_path / "worker.toml",
            name="host-a",
            repositories={"forked": (str(tmp_path / "nowhere"), ["fast", "editable"])},
        )
    )
    offers = repository_offers(config)
    assert offers["forked"].model_dump() == {
        "adapter": "mlx-lm",
        "recipes": ["editable", "fast"],
        "options": {},
    }


def _embedded_job(
    rounds: int, contexts: list[int], *, pair: bool = False, **extra: object
) -> dict[str, object]:
    """An embedded job on `micro` (the service path is the subject, not the model's
    arithmetic); one variant unless `pair` (each variant costs a model load)."""
    variants: list[dict[str, object]] = [{"name": "base"}]
    if pair:
        variants.append({"name": "cand", "flags": {"prefill_step_size": 32}})
    return {
        "variants": variants,
        "contexts": contexts,
        "rounds": rounds,
        "decode_tokens": 1,
        "model": "preset:micro",
        **extra,
    }


def _wait_enrolled(service: Stack, names: set[str], procs: list, logs: list[Path]) -> None:
    service.wait_hosts(names, list(zip(procs, logs, strict=True)), timeout_s=60)


def _measured(service: Stack, run_id: str) -> list[dict]:
    lines = service.artifact(run_id, "records.jsonl").decode().splitlines()
    return [r for r in map(json.loads, lines) if r["round"] >= 0]


def _wait_progress(service: Stack, job_id: str, cells: int, proc, log: Path) -> dict:
    deadline = time.monotonic() + 120
    while True:
        run = service.job(job_id)["runs"][0]
        if (run.get("progress") or {}).get("cells_done", 0) >= cells:
            return run
        assert proc.poll() is None, _log(log)
        assert time.monotonic() < deadline, (run, _log(log))
        time.sleep(0.2)


def test_two_agents_run_each_job_exactly_once(service: Stack, tmp_path: Path) -> None:
    procs, logs = [], []
    for name in ("host-1", "host-2"):
        config = write_config(tmp_path / name / "worker.toml", name=name)
        logs.append(tmp_path / f"{name}.log")
        procs.append(service.start_agent(config, token=service.enrollment_token(), log=logs[-1]))
    _wait_enrolled(service, {"host-1", "host-2"}, procs, logs)
    job_ids = []
    for seed in range(3):
        created = service.submit(_embedded_job(2, [64], seed=seed))
        assert created.status_code == 201, created.text
        job_ids.append(created.json()["id"])
    jobs = service.wait_jobs(job_ids, timeout_s=180, done=("completed", "processed", "failed"))
    hosts = set()
    for job_id, job in jobs.items():
        (run,) = job["runs"]
        assert run["state"] in ("completed", "processed"), run
        # Executed once: one completed attempt (any other is a lease that expired unused).
        states = [a["state"] for a in run["attempts"]]
        assert states.count("completed") == 1 and set(states) <= {"completed", "expired"}, run
        hosts.add(run["host_name"])
        measured = _measured(service, run["id"])
        cells = [(r["variant"], r["round"], r["context_tokens"]) for r in measured]
        variants = [v["name"] for v in job["spec"]["variants"]]
        assert sorted(cells) == sorted((v, r, 64) for v in variants for r in range(2)), job_id
        assert all(r["run_id"] == run["id"] and r["status"] == "ok" for r in measured)
        provenance = json.loads(service.artifact(run["id"], "provenance.json"))
        provenance = provenance.get("runs", [provenance])[0]
        assert provenance["host"]["labels"][0] == "backend:cpu"
    assert hosts == {"host-1", "host-2"}
    for proc, log in zip(procs, logs, strict=True):
        assert stop_process(proc) == 0, _log(log)


def test_an_idle_agent_leaves_the_host_lock_to_a_second_agent_on_its_machine(
    service: Stack, tmp_path: Path
) -> None:
    """Two agents on one machine share its host lock. The first, idle in its long-poll, must
    not hold it: the second would never ask for work while /hosts shows it idle."""
    machine_lock = ["--host-lock", str(tmp_path / "machine.lock")]
    procs, logs = [], []
    for name in ("host-l1", "host-l2"):
        config = write_config(tmp_path / name / "worker.toml", name=name)
        logs.append(tmp_path / f"{name}.log")
        token = service.enrollment_token()
        procs.append(service.start_agent(config, token=token, log=logs[-1], extra=machine_lock))
        _wait_enrolled(service, {name}, procs[-1:], logs[-1:])
    # Only the second agent's host can run it (its automatic `host:` label).
    created = service.submit(_embedded_job(2, [64], host_labels=["host:host-l2"]))
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    job = service.wait_jobs([job_id], timeout_s=180, done=("completed", "processed", "failed"))
    (run,) = job[job_id]["runs"]
    assert run["state"] in ("completed", "processed") and run["host_name"] == "host-l2", run
    # Both lived through it, and each measured under the same lock file.
    for proc, log in zip(procs, logs, strict=True):
        assert stop_process(proc) == 0, _log(log)


def test_killed_agent_run_is_requeued_and_finished_by_the_other(
    service: Stack, tmp_path: Path
) -> None:
    config_a = write_config(tmp_path / "host-ka" / "worker.toml", name="host-ka")
    log_a = tmp_path / "host-ka.log"
    agent_a = service.start_agent(config_a, token=service.enrollment_token(), log=log_a)
    _wait_enrolled(service, {"host-ka"}, [agent_a], [log_a])
    # 5 rounds, a process each: micro's cells are quick, and the kill must come while the
    # rounds after the second cell (4 process starts) are still to run.
    created = service.submit(_embedded_job(5, [64, 128]))
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    _wait_progress(service, job_id, 2, agent_a, log_a)
    stop_process(agent_a, sig=signal.SIGKILL)

    config_b = write_config(tmp_path / "host-kb" / "worker.toml", name="host-kb")
    log_b = tmp_path / "host-kb.log"
    agent_b = service.start_agent(config_b, token=service.enrollment_token(), log=log_b)
    job = service.wait_jobs([job_id], timeout_s=180, done=("completed", "processed", "failed"))
    (run,) = job[job_id]["runs"]
    assert run["state"] in ("completed", "processed"), run
    # host-ka's attempt expired; the last one, host-kb's, completed. (An earlier attempt may have
    # gone to a stopped agent of another test whose long-poll was still open on the server.)
    *lost, last = run["attempts"]
    hosts = dict(service.rows("select id, name from hosts"))
    assert [a["state"] for a in lost] == ["expired"] * len(lost)
    assert "host-ka" in {hosts[a["host_id"]] for a in lost}
    assert (last["state"], hosts[last["host_id"]], run["host_name"]) == (
        "completed",
        "host-kb",
        "host-kb",
    )
    measured = _measured(service, run["id"])
    keys = [(r["variant"], r["round"], r["context_tokens"]) for r in measured]
    assert len(keys) == len(set(keys)) == 10  # every cell once: none lost, none twice
    # Nothing of the killed attempt was uploaded.
    attempts = service.rows("select distinct attempt from artifacts where run_id = :r", r=run["id"])
    assert [a for (a,) in attempts] == [last["attempt"]]
    assert stop_process(agent_b) == 0, _log(log_b)


def test_sigterm_and_cancel_stop_after_the_cell_in_flight(service: Stack, tmp_path: Path) -> None:
    config = write_config(tmp_path / "host-t" / "worker.toml", name="host-t")
    log = tmp_path / "host-t.log"
    agent = service.start_agent(config, token=service.enrollment_token(), log=log)
    _wait_enrolled(service, {"host-t"}, [agent], [log])

    # SIGTERM: the cell in flight finishes, what was measured is uploaded, the run completes.
    first = service.submit(_embedded_job(10, [64, 128])).json()["id"]
    _wait_progress(service, first, 1, agent, log)
    assert stop_process(agent, grace_s=60) == 0, _log(log)
    (run,) = service.job(first)["runs"]
    assert run["state"] == "failed", run
    assert run["reason"].startswith("worker stopped (SIGTERM) after "), run
    done = int(run["reason"].split(" after ")[1].split(" of ")[0])
    assert 1 <= done < 20
    assert len(_measured(service, run["id"])) == done

    # Cancel: the heartbeat says stop; the agent stops after the cell and stays up.
    agent = service.start_agent(config, token=None, log=log)
    second = service.submit(_embedded_job(10, [64, 128])).json()["id"]
    _wait_progress(service, second, 1, agent, log)
    with service.http() as client:
        assert client.post(f"/jobs/{second}/cancel").status_code == 200
    deadline = time.monotonic() + 60
    while "abandoned" not in _log(log) and "cancelled after" not in _log(log):
        assert time.monotonic() < deadline, _log(log)
        time.sleep(0.3)
    (run,) = service.job(second)["runs"]
    assert run["state"] == "cancelled", run
    assert agent.poll() is None
    assert stop_process(agent) == 0, _log(log)


def test_branch_comparison_attributes_each_variant_to_its_commit_and_file(
    service: Stack, tmp_path: Path, mlx_lm_repo: tuple[Path, tuple[str, str]]
) -> None:
    """Two branches of an mlx-lm fork, built in isolation, measured, attributed."""
    repo, (main, slow) = mlx_lm_repo
    config = write_config(
        tmp_path / "host-m" / "worker.toml",
        name="host-m",
        repositories={"fork": (str(repo), ["editable"])},
    )
    log = tmp_path / "host-m.log"
    agent = service.start_agent(config, token=service.enrollment_token(), log=log)
    _wait_enrolled(service, {"host-m"}, [agent], [log])
    created = service.submit(
        {
            "adapter": "mlx-lm",
            "repository": "fork",
            "variants": [{"name": "main", "ref": main}, {"name": "pr", "ref": slow}],
            "contexts": [128],
            "rounds": 2,
            "decode_tokens": 1,
            "model": "preset:micro",
        }
    )
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    job = service.wait_jobs([job_id], timeout_s=240, done=("completed", "processed", "failed"))
    (run,) = job[job_id]["runs"]
    assert run["state"] in ("completed", "processed"), (run, _log(log)[-3000:])

    provenance = json.loads(service.artifact(run["id"], "provenance.json"))
    targets = {t["variant"]: t for t in provenance.get("runs", [provenance])[0]["targets"]}
    state = config.parent / "state"
    for name, ref in (("main", main), ("pr", slow)):
        commit = git(repo, "rev-parse", ref)
        target = targets[name]
        assert (target["repository"], target["ref"], target["commit"]) == (str(repo), ref, commit)
        checkout = state / "worktrees" / "fork" / commit
        # The file the variant process really imported: this commit's checkout, not the host's.
        assert target["engine_module_file"] == str(checkout / "mlx_lm" / "__init__.py")
        assert target["build_module_file"] == target["engine_module_file"]
        assert target["dirty"] is False and target["recipe"] == "editable"
        assert len(target["pip_freeze_sha256"]) == 64
        log_bytes = service.artifact(run["id"], f"build-{name}.log")
        assert target["build_log_sha256"] == hashlib.sha256(log_bytes).hexdigest() or (
            b"reused cached build" in log_bytes
        )
        assert b"mlx_lm imported from " + str(checkout).encode() in log_bytes
    assert targets["main"]["commit"] != targets["pr"]["commit"]
    measured = _measured(service, run["id"])
    widths = {r["variant"]: r["counters"].get("chunk_width_max") for r in measured}
    assert len(measured) == 4 and all(r["status"] == "ok" for r in measured)
    assert widths["pr"] <= 32 < widths["main"]  # the branch's own prefill loop ran
    assert stop_process(agent) == 0, _log(log)


def test_results_wait_in_the_outbox_while_the_api_is_unreachable(
    service: Stack, tmp_path: Path
) -> None:
    """Uploads back off while nothing answers; the outbox survives the agent and is delivered
    by the next one."""
    from coldbench.worker.agent import Agent, AgentOptions
    from coldbench.worker.config import load_host_config
    from coldbench.worker.fingerprint import host_fingerprint
    from coldbench.worker.run import refused_files

    config = load_host_config(write_config(tmp_path / "host-o" / "worker.toml", name="host-o"))
    options = AgentOptions(backoff_max_s=0.2)
    first = Agent(service.url, config, options=options)
    first.enroll(service.enrollment_token())
    job_id = service.submit(_embedded_job(1, [64])).json()["id"]
    host = host_fingerprint()
    lease = None
    while lease is None:
        lease = first.lease(host)
    assert lease.job_id == job_id
    files = refused_files(lease.spec, run_id=lease.run_id, host=host, reason="test")

    # Nothing listens on this port: every request fails to connect.
    down = Agent(f"http://127.0.0.1:{free_port()}", config, options=options)
    down.load_secret()
    folder = down.save_outbox(lease.run_id, lease.attempt, files, status="failed", reason="x")
    down.stopping.set()  # a stopping agent gives up after a few tries and keeps the outbox
    started = time.monotonic()
    down.flush_outbox()
    assert (folder / "complete.json").is_file() and time.monotonic() - started < 10
    assert down.heartbeat_once() is None  # a failed heartbeat is logged, never raised

    again = Agent(service.url, config, options=options)
    again.load_secret()
    again.flush_outbox()
    assert not folder.exists()
    (run,) = service.job(job_id)["runs"]
    assert (run["state"], run["reason"]) == ("failed", "x")
    assert service.artifact(lease.run_id, "reason.txt") == b"test\n"


def test_registration_reports_server_options_without_their_argv(tmp_path: Path) -> None:
    """What a submitter may pick (type, bounds, whether it is proven), never what it runs."""
    from coldbench.worker.agent import repository_offers
    from coldbench.worker.config import load_host_config

    config_path = tmp_path / "worker.toml"
    config_path.write_text(
        "\n".join(
            [
                'name = "host-s"',
                'state_dir = "state"',
                "[repositories.srv]",
                f'url = "{tmp_path / "nowhere"}"',
                'adapter = "openai-server"',
                'server_command = ["{python}", "-m", "mlx_lm", "server", "--port", "{port}"]',
                "[repositories.srv.recipes.editable]",
                'command = ["{python}", "-m", "pip", "install", "-e", "."]',
                "[repositories.srv.options.prefill_step_size]",
                'type = "int"',
                "min = 64",
                "max = 16384",
                'argv = ["--prefill-step-size", "{value}"]',
                'proof = "Prompt processing progress: {value}/"',
                "stock = 2048",
                "prefill_step = true",
            ]
        )
        + "\n"
    )
    offer = repository_offers(load_host_config(config_path))["srv"]
    assert offer.model_dump() == {
        "adapter": "openai-server",
        "recipes": ["editable"],
        "options": {"prefill_step_size": {"type": "int", "min": 64, "max": 16384, "proof": True}},
    }


def test_an_upload_receipt_for_other_bytes_is_retried(tmp_path: Path) -> None:
    """The agent reads the API's ArtifactReceipt (coldbench.evidence.contract.protocol): a receipt
    whose digest or size is not what was sent means the server does not hold this file, so it is
    sent again, never counted as delivered."""
    import httpx

    from coldbench.worker.agent import Agent, _Retry
    from coldbench.worker.config import HostConfig

    content = b"records\n"
    digest = hashlib.sha256(content).hexdigest()
    receipts: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        stored = receipts.pop(0)
        return httpx.Response(
            201,
            json={
                "run_id": "r-1",
                "attempt": 1,
                "name": "records.jsonl",
                "sha256": stored,
                "bytes": len(content),
                "created": True,
            },
        )

    config = HostConfig(name="h", labels=(), models={}, repositories={}, state_dir=tmp_path)
    agent = Agent("http://testserver", config, transport=httpx.MockTransport(answer))
    agent.secret = {"api": "http://testserver", "worker_id": "w", "secret": "cbw_x"}
    files = tmp_path / "outbox" / "files"
    files.mkdir(parents=True)
    (files / "records.jsonl").write_bytes(content)
    receipts.append(digest)
    agent._upload_all(files.parent, "r-1", 1)
    receipts.append("0" * 64)
    with pytest.raises(_Retry, match="records.jsonl: the server stored sha256 0000000000000000"):
        agent._upload_all(files.parent, "r-1", 1)


def test_the_admins_labels_keep_the_corpus_label_the_host_derives(
    service: Stack, tmp_path: Path
) -> None:
    """Issue 46: `coldbench admin labels HOST --set a,b` erased the host's `corpus:NAME` label,
    and a restart did not bring it back, so corpus jobs were refused. The admin's labels and
    the host's are two sets: after the admin's change and after a restart of the agent, a job
    on the host's corpus is still accepted and leased, and one needing the admin's label too."""
    config = write_config(tmp_path / "corpus-host" / "worker.toml", name="corpus-host")
    corpus = config.parent / "code.txt"
    corpus.write_text("".join(f"def f{i}(x):\n    return x * {i}\n\n" for i in range(300)))
    config.write_text(config.read_text() + '[corpora]\ncode = "code.txt"\n')
    log = tmp_path / "corpus-host.log"
    proc = service.start_agent(config, token=service.enrollment_token("lab:old"), log=log)
    _wait_enrolled(service, {"corpus-host"}, [proc], [log])
    output = service.cli("admin", "labels", "corpus-host", "--set", "team:a,lab:new")
    assert "corpus:code" in output.split(",") and "lab:old" not in output.split(","), output
    with service.http() as client:
        (host,) = [h for h in client.get("/hosts").json() if h["name"] == "corpus-host"]
    assert host["admin_labels"] == ["lab:new", "team:a"]
    assert "corpus:code" in host["host_labels"] and "corpus:code" in host["labels"]
    job_ids = []
    for round_ in range(2):
        if round_ == 1:
            # The agent restarts with its secret: nothing it sends changes either set.
            assert stop_process(proc) == 0, _log(log)
            proc = service.start_agent(config, token=None, log=log)
        created = service.submit(
            _embedded_job(1, [64], corpus="code", host_labels=["team:a"], seed=round_)
        )
        assert created.status_code == 201, created.text
        job_ids.append(created.json()["id"])
        jobs = service.wait_jobs(
            job_ids[-1:], timeout_s=120, done=("completed", "processed", "failed")
        )
        (run,) = jobs[job_ids[-1]]["runs"]
        assert run["host_name"] == "corpus-host" and run["state"] != "failed", (run, _log(log))
    assert stop_process(proc) == 0, _log(log)
