"""The run request: what `specdraft train` was asked to run, built once and handed whole to
every layer that runs it (the deployment dispatch, the managed run, the trainer ranks).

A request carries the validated `Config` (with the launch's rank counts applied) and the file and
`--set` overrides it came from, because the processes a run starts (capture servers, producer,
the managed run's trainer ranks) load the same config from the same file. It crosses a process
boundary in two ways: pickled to the ranks of the elastic launcher, and as the JSON file the
managed run hands `python -m specdraft.trainer.disagg.consumer` (`to_json` / `from_json`, which
round-trip). The flags of `specdraft train` are parsed once, by the CLI.

It sits at the package root, next to `launch.py` (its `LaunchPlan`) and `deployment.py` (its
dispatch): the CLI, the dispatch, the rank entry point and the disaggregated runtime all read it,
and none of them owns it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Literal

from specdraft.config import Config, load_config

from .launch import LaunchPlan
from .train.preempt import DEFAULT_STOP_TIMEOUT as DEFAULT_STOP_TIMEOUT_S

Deployment = Literal["local", "disaggregated", "managed"]


@dataclass(frozen=True)
class RunRequest:
    """One training run as asked for: the config, where it came from, and how to launch it."""

    config: Config
    config_path: str
    overrides: tuple[str, ...] = ()
    # A checkpoint folder or "latest"; None starts fresh (unless training.resume_from is set).
    resume: str | None = None
    # Data-order fields a resume may find changed (--allow-changed).
    allow_changed: tuple[str, ...] = ()
    launch: LaunchPlan = field(default_factory=lambda: LaunchPlan(nproc_per_node=1))
    progress: bool = True
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S
    # A fresh run into a used output_dir moves the old run aside instead of being refused.
    overwrite: bool = False

    @classmethod
    def create(
        cls,
        config_path: str,
        overrides: Sequence[str] = (),
        *,
        launch: LaunchPlan | None = None,
        resume: str | None = None,
        allow_changed: Sequence[str] = (),
        progress: bool = True,
        stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
        overwrite: bool = False,
    ) -> RunRequest:
        """Load the config once and fix the launch; a launch whose rank counts differ from the
        config's becomes two more overrides, so every process of the run reads the same config.

        Raises `ConfigError` for a bad config (or rank counts outside its bounds).
        """
        overrides = tuple(overrides)
        config = load_config(config_path, overrides)
        deployment = config.deployment
        if launch is None:
            launch = LaunchPlan(nproc_per_node=deployment.nproc_per_node, nnodes=deployment.nnodes)
        if (launch.nproc_per_node, launch.nnodes) != (deployment.nproc_per_node, deployment.nnodes):
            overrides = (
                *overrides,
                f"deployment.nproc_per_node={launch.nproc_per_node}",
                f"deployment.nnodes={launch.nnodes}",
            )
            config = load_config(config_path, overrides)
        return cls(
            config=config,
            config_path=str(config_path),
            overrides=overrides,
            resume=resume,
            allow_changed=tuple(allow_changed),
            launch=launch,
            progress=progress,
            stop_timeout_s=stop_timeout_s,
            overwrite=overwrite,
        )

    @property
    def deployment(self) -> Deployment:
        """How the run is deployed: local ranks, ranks of a disaggregated run whose services
        already run, or a managed disaggregated run that starts its services itself."""
        deployment = self.config.deployment
        if deployment.mode != "disaggregated":
            return "local"
        return "managed" if deployment.disaggregated.managed else "disaggregated"

    @property
    def resuming(self) -> bool:
        """Whether the run continues from a checkpoint (--resume or training.resume_from)."""
        return self.resume is not None or self.config.training.resume_from is not None

    def with_overrides(self, *more: str) -> RunRequest:
        """The same request with more `--set` overrides (the config reloaded with them)."""
        overrides = (*self.overrides, *more)
        return replace(self, overrides=overrides, config=load_config(self.config_path, overrides))

    def to_json(self) -> str:
        """This request as the JSON `from_json` reads (the file the managed run hands its
        trainer process): what `create` takes; the config is reloaded from its file."""
        fields = {name: getattr(self, name) for name in JSON_FIELDS}
        fields["launch"] = asdict(self.launch)
        return json.dumps(fields, indent=2)

    @classmethod
    def from_json(cls, text: str) -> RunRequest:
        """Read what `to_json` wrote: `ValueError` for text that is not a request,
        `ConfigError` for a bad config (or rank counts outside its bounds)."""
        fields = json.loads(text)
        if not isinstance(fields, dict) or sorted(fields) != sorted(JSON_FIELDS):
            raise ValueError(f"not a run request: a JSON object of {', '.join(JSON_FIELDS)}")
        try:
            launch = LaunchPlan(**fields.pop("launch"))
        except TypeError as exc:
            raise ValueError(f"not a run request: its launch: {exc}") from None
        return cls.create(
            fields.pop("config_path"), fields.pop("overrides"), launch=launch, **fields
        )


# What `to_json` writes: the arguments of `RunRequest.create` (the config is reloaded from them).
JSON_FIELDS = (
    "config_path",
    "overrides",
    "launch",
    "resume",
    "allow_changed",
    "progress",
    "stop_timeout_s",
    "overwrite",
)
