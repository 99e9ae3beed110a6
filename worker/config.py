"""The host's own configuration (`worker.toml`): labels, models, the repository allow-list and
its build recipes. Only the host owner writes it; a job can only pick among what it names.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evidence.schemas import NAME_PATTERN

LABEL_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:=-]{0,63}$")
MODULE_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
ADAPTERS = ("embedded", "mlx-lm", "openai-server")
# The module whose import path a build checks, by adapter (a repository may name another).
DEFAULT_MODULES = {"embedded": "engine", "mlx-lm": "mlx_lm", "openai-server": "mlx_lm"}
# What `coldbench run --repo PATH` builds with when no worker.toml names recipes.
EDITABLE_COMMAND = (
    "{python}",
    "-m",
    "pip",
    "install",
    "--no-deps",
    "--no-build-isolation",
    "-e",
    ".",
)


class ConfigError(ValueError):
    """worker.toml is unusable; the message names the key and what to do."""


@dataclass(frozen=True)
class Recipe:
    name: str
    command: tuple[str, ...]  # argv; `{python}` is the build venv's interpreter
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RepositoryConfig:
    name: str
    url: str  # a URL git understands or an absolute local path
    module: str = "mlx_lm"  # the engine module whose import path the build checks
    adapter: str = "mlx-lm"
    recipes: dict[str, Recipe] = field(default_factory=dict)
    # openai-server only: the argv that starts the server, `{python}` (the build venv's
    # interpreter), `{port}` and `{model}` filled in per variant. Host-owned, like recipes.
    server_command: tuple[str, ...] | None = None


@dataclass(frozen=True)
class HostConfig:
    name: str
    labels: tuple[str, ...]
    models: dict[str, Path]
    repositories: dict[str, RepositoryConfig]
    state_dir: Path
    path: Path | None = None

    @property
    def secret_path(self) -> Path:
        """The worker's secret: beside the config, readable only by its owner."""
        if self.path is None:
            return self.state_dir / "worker.secret"
        return self.path.with_name(self.path.stem + ".secret")

    def recipes_offered(self) -> dict[str, dict[str, list[str]]]:
        """What registration tells the server: repository -> its recipe names."""
        return {name: {"recipes": sorted(repo.recipes)} for name, repo in self.repositories.items()}


def default_recipes() -> dict[str, Recipe]:
    return {"editable": Recipe("editable", EDITABLE_COMMAND)}


def local_repository(
    path: Path, *, module: str | None = None, adapter: str = "mlx-lm"
) -> RepositoryConfig:
    """The repository of `coldbench run --repo PATH`: the maintainer's own checkout (for
    `adapter="embedded"`, a checkout of coldbench whose engine/ the variants run)."""
    if adapter not in ADAPTERS:
        raise ConfigError(f"--adapter {adapter!r}: choose one of {', '.join(ADAPTERS)}")
    resolved = path.expanduser().resolve()
    if not (resolved / ".git").exists() and not (resolved / "HEAD").exists():
        raise ConfigError(f"--repo {path}: not a git repository (no .git found)")
    name = re.sub(r"[^A-Za-z0-9_.+-]+", "-", resolved.name).strip("-.") or "repo"
    return RepositoryConfig(
        name=name,
        url=str(resolved),
        module=module or DEFAULT_MODULES[adapter],
        adapter=adapter,
        recipes=default_recipes(),
    )


def _string_list(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where} must be a list of strings")
    return value


def _recipe(name: str, raw: Any, where: str) -> Recipe:
    if not re.fullmatch(NAME_PATTERN, name):
        raise ConfigError(f"{where}: recipe name {name!r} must be a plain name")
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a table with `command` and optional `env`")
    command = _string_list(raw.get("command"), f"{where}.command")
    if not command:
        raise ConfigError(f"{where}.command is empty")
    env = raw.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ConfigError(f"{where}.env must map names to strings")
    unknown = set(raw) - {"command", "env"}
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
    return Recipe(name=name, command=tuple(command), env=dict(env))


def _repository(name: str, raw: Any, base: Path) -> RepositoryConfig:
    where = f"repositories.{name}"
    if not re.fullmatch(NAME_PATTERN, name):
        raise ConfigError(f"{where}: repository name must be a plain name")
    if not isinstance(raw, dict) or not isinstance(raw.get("url"), str) or not raw["url"]:
        raise ConfigError(f"{where}.url is required (a git URL or a local path)")
    url = raw["url"]
    if url.startswith("-"):
        raise ConfigError(f"{where}.url must not start with '-'")
    if "://" not in url and not re.match(r"^[\w.-]+@[\w.-]+:", url):
        url = str((base / Path(url).expanduser()).resolve())  # a local path, relative to the file
    adapter = raw.get("adapter", "mlx-lm")
    if adapter not in ADAPTERS:
        raise ConfigError(f"{where}.adapter must be one of {', '.join(ADAPTERS)}")
    module = raw.get("module", DEFAULT_MODULES[adapter])
    if not isinstance(module, str) or not MODULE_PATTERN.fullmatch(module):
        raise ConfigError(f"{where}.module must be a Python module name")
    recipes_raw = raw.get("recipes", {})
    if not isinstance(recipes_raw, dict) or not recipes_raw:
        raise ConfigError(f"{where}.recipes: define at least one build recipe")
    recipes = {
        rname: _recipe(rname, rraw, f"{where}.recipes.{rname}")
        for rname, rraw in recipes_raw.items()
    }
    server_command = None
    if adapter == "openai-server":
        if "server_command" not in raw:
            raise ConfigError(
                f"{where}.server_command is required for the openai-server adapter "
                '(an argv list such as ["{python}", "-m", "mlx_lm.server", "--model", "{model}", '
                '"--port", "{port}"])'
            )
        server_command = tuple(_string_list(raw["server_command"], f"{where}.server_command"))
        if not server_command or "{port}" not in " ".join(server_command):
            raise ConfigError(f"{where}.server_command must be a non-empty argv naming {{port}}")
    elif "server_command" in raw:
        raise ConfigError(f'{where}.server_command only applies to adapter = "openai-server"')
    unknown = set(raw) - {"url", "module", "adapter", "recipes", "server_command"}
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
    return RepositoryConfig(
        name=name,
        url=url,
        module=module,
        adapter=adapter,
        recipes=recipes,
        server_command=server_command,
    )


def parse_host_config(raw: dict[str, Any], *, base: Path, path: Path | None = None) -> HostConfig:
    name = raw.get("name")
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
        raise ConfigError("name: give the host a plain name (letters, digits, _ . + -)")
    labels = _string_list(raw.get("labels", []), "labels")
    bad = [label for label in labels if not LABEL_PATTERN.fullmatch(label)]
    if bad:
        raise ConfigError(f"labels: not a valid label: {', '.join(bad)}")
    models_raw = raw.get("models", {})
    if not isinstance(models_raw, dict):
        raise ConfigError("models must be a table of name = path")
    models: dict[str, Path] = {}
    for model_name, model_path in models_raw.items():
        if not re.fullmatch(NAME_PATTERN, model_name) or not isinstance(model_path, str):
            raise ConfigError(f"models.{model_name}: a plain name mapped to a path")
        models[model_name] = (base / Path(model_path).expanduser()).resolve()
    repos_raw = raw.get("repositories", {})
    if not isinstance(repos_raw, dict):
        raise ConfigError("repositories must be a table")
    repositories = {rname: _repository(rname, rraw, base) for rname, rraw in repos_raw.items()}
    state_dir_raw = raw.get("state_dir", "coldbench-state")
    if not isinstance(state_dir_raw, str):
        raise ConfigError("state_dir must be a path")
    unknown = set(raw) - {"name", "labels", "models", "repositories", "state_dir"}
    if unknown:
        raise ConfigError(f"unknown top-level keys {sorted(unknown)}")
    return HostConfig(
        name=name,
        labels=tuple(labels),
        models=models,
        repositories=repositories,
        state_dir=(base / Path(state_dir_raw).expanduser()).resolve(),
        path=path,
    )


def load_host_config(path: Path) -> HostConfig:
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML ({error})") from None
    try:
        return parse_host_config(raw, base=path.resolve().parent, path=path.resolve())
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
