"""The host's own configuration (`worker.toml`): labels, models, prompt corpora, the repository
allow-list, its build recipes and, for server repositories, the server command, its options, the
cache paths wiped before each start and the first-token bound. Only the host owner writes it; a
job can only pick among what it names.

The file is read through pydantic models (`HostFile` and below): an unusable file is one line
naming the key, e.g. `repositories.mlx-lm.options.fast.max: ...`. The option declaration type
is `coldbench.evidence.spec.options.HostOption`, the contract the API validates against too.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from coldbench.engine.adapter_traits import ADAPTERS, runs_checkout_engine, starts_server
from coldbench.evidence.contract.schemas import (
    BUILTIN_CORPUS,
    CORPUS_NAME_PATTERN,
    INSTALLED_SERVER,
    NAME_PATTERN,
    REPOSITORY_ADAPTER,
    AdapterName,
    HostNoise,
    error_line,
    is_label,
)
from coldbench.evidence.spec.options import OPTION_NAME_PATTERN, HostOption

MODULE_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
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
# `offline`: installs nothing, so it needs no package index and no build backend (a GPU host
# with only the packages it has). An embedded repository's variants run their worktree first on
# PYTHONPATH, and the build's import check (worker/build.py) proves engine/ and its fast-path
# package come from it; the command itself only proves the checkout imports. For an mlx-lm
# repository the check fails, naming the file mlx_lm was imported from.
# `{engine_package}` and `{fast_path_package}` are the tree's: `coldbench.engine` and
# `coldbench.kernels`, or `engine` and `fastpaths` (`kernels`) in a tree from before the move
# (coldbench.worker.build.engine_layout).
OFFLINE_COMMAND = ("{python}", "-c", "import {engine_package}, {fast_path_package}")
# A server that streams no token this long after the request is treated as dead (its
# generation thread gone); hosts serving long contexts on slow machines raise it.
DEFAULT_FIRST_TOKEN_TIMEOUT_S = 300.0
SERVER_COMMAND_EXAMPLE = (
    '["{python}", "-m", "mlx_lm", "server", "--model", "{model}", "--port", "{port}", '
    '"--prompt-cache-size", "0"]'
)


class ConfigError(ValueError):
    """worker.toml is unusable; the message names the key and what to do."""


@dataclass(frozen=True)
class Recipe:
    name: str
    # argv; `{python}` is the build venv's interpreter, `{engine_package}` and
    # `{fast_path_package}` the checkout's packages (coldbench.worker.build.recipe_command)
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RepositoryConfig:
    name: str
    # A URL git understands or an absolute local path; None only for `coldbench run
    # --adapter openai-server` without --repo: the server runs from this interpreter.
    url: str | None
    module: str = "mlx_lm"  # the engine module whose import path the build checks
    adapter: str = REPOSITORY_ADAPTER
    recipes: dict[str, Recipe] = field(default_factory=dict)
    # openai-server only: the argv that starts the server, `{python}` (the build venv's
    # interpreter), `{port}` and `{model}` filled in per variant. Host-owned, like recipes.
    server_command: tuple[str, ...] | None = None
    # openai-server only: what variants may ask of the server (`name=value`), host-declared.
    options: dict[str, HostOption] = field(default_factory=dict)
    # openai-server only: the server's on-disk caches, deleted before every server start.
    wipe: tuple[str, ...] = ()
    first_token_timeout_s: float = DEFAULT_FIRST_TOKEN_TIMEOUT_S
    # The recipe a variant that names none builds with, where there are several (`coldbench
    # run --repo`: `editable`, with `offline` beside it); None: worker.toml's rule.
    default_recipe: str | None = None


@dataclass(frozen=True)
class HostConfig:
    name: str
    labels: tuple[str, ...]
    models: dict[str, Path]
    repositories: dict[str, RepositoryConfig]
    state_dir: Path
    path: Path | None = None
    # `[corpora]`: prompt corpora a job may name (engine/corpus.py), name -> text file
    corpora: dict[str, Path] = field(default_factory=dict)
    # Synthetic presets jobs may name as `preset:NAME` (none by default: a large preset is a
    # checkpoint of tens of GB written on first use).
    allow_presets: tuple[str, ...] = ()
    # Start each block's variant processes while the previous block warms up (None: on for
    # GPU backends, off on the CPU backend: coldbench.worker.run.default_prespawn).
    prespawn: bool | None = None
    # `calibration`: the noise of this host's `coldbench calibrate` result (block lengths and
    # the design effect of its runs follow it); None: the conservative default.
    noise: HostNoise | None = None

    def model_names(self) -> list[str]:
        """The models this host offers: its configured names and `preset:NAME` per allowed one."""
        return sorted(self.models) + [f"preset:{name}" for name in sorted(self.allow_presets)]

    @property
    def secret_path(self) -> Path:
        """The worker's secret: beside the config, readable only by its owner."""
        if self.path is None:
            return self.state_dir / "worker.secret"
        return self.path.with_name(self.path.stem + ".secret")


def default_recipes(adapter: str = REPOSITORY_ADAPTER) -> dict[str, Recipe]:
    """`editable`, and for embedded repositories also `offline` (see OFFLINE_COMMAND)."""
    recipes = {"editable": Recipe("editable", EDITABLE_COMMAND)}
    if runs_checkout_engine(adapter):
        recipes["offline"] = Recipe("offline", OFFLINE_COMMAND)
    return recipes


def local_repository(
    path: Path, *, module: str | None = None, adapter: str = REPOSITORY_ADAPTER
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
        module=module or ADAPTERS[adapter].target_module,
        adapter=adapter,
        recipes=default_recipes(adapter),
        default_recipe="editable",
    )


# -- the file, as pydantic models ------------------------------------------------------------

PlainName = Annotated[str, Field(pattern=NAME_PATTERN)]
OptionName = Annotated[str, Field(pattern=OPTION_NAME_PATTERN)]
Argv = Annotated[list[str], Field(min_length=1)]


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class RecipeFile(_Table):
    command: Argv
    env: dict[str, str] = Field(default_factory=dict)


def check_wipe_path(raw: str) -> str:
    """An absolute cache folder that is not `/`, the home folder or above it (ValueError)."""
    expanded = os.path.normpath(os.path.expanduser(raw))
    if not os.path.isabs(expanded):
        raise ValueError(f"{raw!r} must be an absolute path (or start with ~/)")
    home = os.path.normpath(os.path.expanduser("~"))
    if expanded == os.sep or home == expanded or home.startswith(expanded.rstrip(os.sep) + os.sep):
        raise ValueError(f"{raw!r} would delete / or the home folder: name the cache folder")
    return expanded


class RepositoryFile(_Table):
    url: str = Field(min_length=1)
    module: str | None = None  # default: the adapter's target_module (engine/adapter_traits.py)
    adapter: AdapterName = REPOSITORY_ADAPTER
    recipes: dict[PlainName, RecipeFile] = Field(default_factory=dict, validate_default=True)
    server_command: Argv | None = None
    options: dict[OptionName, HostOption] = Field(default_factory=dict)
    wipe: list[str] = Field(default_factory=list)
    first_token_timeout_s: float = Field(DEFAULT_FIRST_TOKEN_TIMEOUT_S, gt=0, le=86_400)

    model_config = ConfigDict(extra="forbid", strict=False)

    @field_validator("url")
    @classmethod
    def _not_an_option(cls, url: str) -> str:
        if url.startswith("-"):
            raise ValueError("must not start with '-'")
        return url

    @field_validator("module")
    @classmethod
    def _module_name(cls, module: str | None) -> str | None:
        if module is not None and not MODULE_PATTERN.fullmatch(module):
            raise ValueError("must be a Python module name")
        return module

    @field_validator("recipes")
    @classmethod
    def _some_recipe(cls, recipes: dict[str, RecipeFile]) -> dict[str, RecipeFile]:
        if not recipes:
            raise ValueError("define at least one build recipe")
        return recipes

    @field_validator("wipe")
    @classmethod
    def _wipe_paths(cls, wipe: list[str]) -> list[str]:
        return [check_wipe_path(path) for path in wipe]

    @field_validator("server_command")
    @classmethod
    def _names_port(cls, command: list[str] | None) -> list[str] | None:
        if command is not None and not any("{port}" in arg for arg in command):
            raise ValueError("must be a non-empty argv naming {port} (the adapter picks it)")
        return command

    @model_validator(mode="after")
    def _server_keys_need_a_server(self) -> RepositoryFile:
        if starts_server(self.adapter):
            if self.server_command is None:
                raise ValueError(
                    f"server_command is required for the {self.adapter} adapter "
                    f"(an argv list such as {SERVER_COMMAND_EXAMPLE})"
                )
            return self
        given = [
            key
            for key in ("server_command", "options", "wipe", "first_token_timeout_s")
            if key in self.model_fields_set
        ]
        if given:
            servers = " or ".join(f'"{name}"' for name in ADAPTERS if starts_server(name))
            raise ValueError(f"{', '.join(given)}: apply only to adapter = {servers}")
        return self


class HostFile(_Table):
    name: PlainName
    labels: list[str] = Field(default_factory=list)
    models: dict[PlainName, str] = Field(default_factory=dict)
    repositories: dict[PlainName, RepositoryFile] = Field(default_factory=dict)
    state_dir: str = "coldbench-state"
    # Presets jobs may name as `preset:NAME`; none by default (a large one is tens of GB).
    allow_presets: list[str] = Field(default_factory=list)
    # name -> text file; checked by `_corpora` (names, existence) with its own messages
    corpora: dict[str, Any] = Field(default_factory=dict)
    prespawn: bool | None = None
    calibration: str | None = None  # a `coldbench calibrate` result file (checked by `_noise`)

    @field_validator("labels")
    @classmethod
    def _labels(cls, labels: list[str]) -> list[str]:
        bad = [label for label in labels if not is_label(label)]
        if bad:
            raise ValueError(f"not a valid label: {', '.join(bad)}")
        return labels

    @field_validator("allow_presets")
    @classmethod
    def _known_presets(cls, presets: list[str]) -> list[str]:
        from coldbench.engine.presets import PRESETS

        unknown = sorted(set(presets) - set(PRESETS))
        if unknown:
            raise ValueError(
                f"unknown preset(s) {', '.join(unknown)}; known: {', '.join(sorted(PRESETS))}"
            )
        return presets


# Pydantic's wording for the error types a hand-written worker.toml runs into, said the way
# a host owner would fix them.
_MESSAGES = {
    "missing": "is required",
    "extra_forbidden": "unknown key (a typo?)",
    "list_type": "must be a list of strings",
    "string_type": "must be a string",
    "dict_type": "must be a table",
    "model_type": "must be a table",
    "model_attributes_type": "must be a table",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "literal_error": "must be one of {expected}",
    "too_short": "must not be empty",
}


def _key(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc if not str(part).startswith("function-"))


def describe_validation_error(error: ValidationError, *, prefix: str = "") -> str:
    """The first problem of a worker.toml as `key.path: what is wrong` (one line)."""
    first = error.errors(include_url=False)[0]
    is_key = bool(first["loc"]) and first["loc"][-1] == "[key]"
    loc = tuple(part for part in first["loc"] if part != "[key]")
    key = ".".join(p for p in (prefix, _key(loc)) if p)
    kind = first["type"]
    ctx = first.get("ctx") or {}
    if kind == "value_error":
        message = str(ctx.get("error") or first["msg"])
    elif kind == "string_pattern_mismatch":
        if is_key and len(loc) >= 2 and loc[-2] == "options":
            message = "an option name is lower case: a-z, 0-9 and _ (like a flag)"
        else:
            message = f"{first['input']!r} is not a plain name (letters, digits, _ . + -)"
    elif kind in ("greater_than", "less_than_equal"):
        bound = ctx.get("gt", ctx.get("le"))
        message = f"must be {'above' if kind == 'greater_than' else 'at most'} {bound}"
    elif kind in _MESSAGES:
        message = _MESSAGES[kind].format(expected=ctx.get("expected", "")).strip()
    else:
        message = first["msg"]
    return f"{key}: {message}" if key else message


def _corpora(raw: Any, base: Path) -> dict[str, Path]:
    """`[corpora]`: name = "path/to/file.txt" (relative to worker.toml); each file must exist."""
    if not isinstance(raw, dict):
        raise ConfigError('corpora must be a table of name = "path/to/text-file"')
    corpora: dict[str, Path] = {}
    for name, value in raw.items():
        if not re.fullmatch(CORPUS_NAME_PATTERN, name) or name == BUILTIN_CORPUS:
            raise ConfigError(
                f"corpora.{name}: a plain name (letters, digits, _ . -), not {BUILTIN_CORPUS!r}"
            )
        if not isinstance(value, str) or not value:
            raise ConfigError(f"corpora.{name}: the path of a UTF-8 text file")
        file = (base / Path(value).expanduser()).resolve()
        if not file.is_file():
            raise ConfigError(f"corpora.{name}: {file} is not a file")
        corpora[name] = file
    return corpora


def load_noise(path: Path) -> HostNoise:
    """The noise of a `coldbench calibrate` result file (ConfigError, one line, otherwise)."""
    from coldbench.evidence.contract.calibration import HostCalibration

    try:
        result = HostCalibration.model_validate_json(path.read_bytes())
    except OSError as error:
        raise ConfigError(f"calibration {path}: {error.strerror or error}") from None
    except ValidationError as error:
        detail = error_line(error)
        raise ConfigError(f"calibration {path}: not a calibration result ({detail})") from None
    if result.noise is None:
        raise ConfigError(
            f"calibration {path}: it has no noise (variance components): calibrate again"
        )
    return result.noise


def parse_host_config(raw: dict[str, Any], *, base: Path, path: Path | None = None) -> HostConfig:
    try:
        parsed = HostFile.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(describe_validation_error(error)) from None
    repositories = {
        name: _repository(name, repo, base) for name, repo in parsed.repositories.items()
    }
    corpora = _corpora(parsed.corpora, base)
    # a job naming a corpus goes only to hosts that have it: the server matches this label
    labels = [
        *parsed.labels,
        *(f"corpus:{n}" for n in corpora if f"corpus:{n}" not in parsed.labels),
    ]
    return HostConfig(
        name=parsed.name,
        labels=tuple(labels),
        models={n: (base / Path(p).expanduser()).resolve() for n, p in parsed.models.items()},
        repositories=repositories,
        state_dir=(base / Path(parsed.state_dir).expanduser()).resolve(),
        path=path,
        allow_presets=tuple(dict.fromkeys(parsed.allow_presets)),
        corpora=corpora,
        prespawn=parsed.prespawn,
        noise=load_noise(base / Path(parsed.calibration).expanduser())
        if parsed.calibration
        else None,
    )


def _repository(name: str, repo: RepositoryFile, base: Path) -> RepositoryConfig:
    url = repo.url
    if "://" not in url and not re.match(r"^[\w.-]+@[\w.-]+:", url):
        url = str((base / Path(url).expanduser()).resolve())  # a local path, relative to the file
    return RepositoryConfig(
        name=name,
        url=url,
        module=repo.module or ADAPTERS[repo.adapter].target_module,
        adapter=repo.adapter,
        recipes={
            rname: Recipe(name=rname, command=tuple(recipe.command), env=dict(recipe.env))
            for rname, recipe in repo.recipes.items()
        },
        server_command=tuple(repo.server_command) if repo.server_command else None,
        options=dict(repo.options),
        wipe=tuple(repo.wipe),
        first_token_timeout_s=repo.first_token_timeout_s,
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


def server_repository(
    *,
    adapter: str,
    server_command: str,
    options: list[str],
    wipe: list[str],
    first_token_timeout_s: float | None,
    repo: Path | None = None,
    module: str | None = None,
) -> RepositoryConfig:
    """The server repository of `coldbench run --adapter ADAPTER` for an adapter that starts a
    server (openai-server), where the user is the host: the same declarations as worker.toml
    (`--option NAME={inline TOML table}`), checked by the same models. Without `repo`, the
    server runs from this interpreter (no builds)."""
    import shlex

    try:
        command = shlex.split(server_command)
    except ValueError as error:
        raise ConfigError(f"--server-command: {error}") from None
    declared: dict[str, Any] = {}
    for text in options:
        name, sep, table = text.partition("=")
        if not sep or not table.strip():
            raise ConfigError(
                f"--option {text!r}: give NAME={{type = ..., argv = [...], proof = ...}}"
            )
        try:
            declared[name] = tomllib.loads(f"option = {table}")["option"]
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"--option {name}: not an inline TOML table ({error})") from None
    raw: dict[str, Any] = {
        "url": str(repo) if repo is not None else "installed",
        "module": module,
        "adapter": adapter,
        "recipes": {"editable": {"command": list(EDITABLE_COMMAND)}},
        "server_command": command,
        "options": declared,
        "wipe": wipe,
    }
    if first_token_timeout_s is not None:
        raw["first_token_timeout_s"] = first_token_timeout_s
    try:
        parsed = RepositoryFile.model_validate(raw)
    except ValidationError as error:
        message = describe_validation_error(error)
        for key, flag in (
            ("options.", "--option "),
            ("server_command", "--server-command"),
            ("wipe", "--wipe"),
            ("first_token_timeout_s", "--first-token-timeout-s"),
        ):
            if message.startswith(key):
                message = flag + message[len(key) :]
                break
        raise ConfigError(message) from None
    if repo is not None:
        checkout = local_repository(repo, module=module, adapter=adapter)
        return dataclasses.replace(_repository(checkout.name, parsed, Path.cwd()), url=checkout.url)
    return dataclasses.replace(_repository(INSTALLED_SERVER, parsed, Path.cwd()), url=None)
