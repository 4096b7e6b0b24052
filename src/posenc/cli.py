"""``python train.py``: the command line around ``posenc.train.train``.

``cli`` is what ``train.py`` runs. A single run is composed once (``run_once``: Hydra's own
path for a run, the config it composes is the one that is checked and trained); overrides
that do not compose stop it with one line (exit 2, no traceback, nothing written), and a
refused run (``ConfigError``, ``DataError``, from ``train``'s checks) is one line too. A
sweep (``-m``) and Hydra's flags go through ``main``, the ``@hydra.main`` wrapper, a sweep
after every point has been checked. Kept apart from ``posenc.train`` so that the command
line can change without touching the code every training run goes through (the study's
stages depend on that, ``posenc.fingerprint.study_core``).
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from . import CONFIG_DIR, tracking
from .config import check_attention, check_device, check_optim, check_ranges
from .errors import ConfigError, DataError
from .spelling import did_you_mean


#: the job's name, which Hydra gives its log (``<run>/train.log``); by default Hydra would
#: name it after the file that holds ``main``, this one
JOB_NAME = "train"


#: folders of conf/ that are no choice of a run: ``--help`` leaves them out, and a run refuses them
NOT_A_RUN_GROUP = {
    "executor": "where the study's jobs run (python -m pipelines.study --executor <preset>, or POSENC_EXECUTOR); "
                "a run chooses its device with trainer=cpu, gpu or ddp",
    "schema": "the schema conf/model/*.yaml extend, no choice of a run",
    "hydra": "Hydra's own settings: python train.py --hydra-help",
}


def run_groups(overrides: list[str] = ()) -> dict[str, list[str]]:
    """The config groups a run takes, with their options (``conf/<group>/<option>.yaml``, and
    those of the folders a ``hydra.searchpath`` override adds)."""
    roots = config_roots(overrides)
    groups = sorted({d.name for d in Path(CONFIG_DIR).iterdir() if d.is_dir()} - set(NOT_A_RUN_GROUP))
    return {g: options(g, roots) for g in groups}


def help_text(overrides: list[str]) -> str:
    """``python train.py --help``: the groups a run takes and the config the overrides compose
    (Hydra's own help would also list ``executor`` and ``schema``, which a run does not take)."""
    from .config import compose

    groups = "\n".join(f"{g}: {', '.join(names)}" for g, names in run_groups(overrides).items())
    config = OmegaConf.to_yaml(compose(run_overrides(overrides)))
    return (f"python train.py [group=option ...] [key=value ...]  (-m: a sweep; --hydra-help: Hydra's own flags)\n\n"
            f"== Configuration groups ==\n{groups}\n\n== Config ==\n{config}")


def refuse(error: Exception) -> None:
    """A refused run: one line naming the setting and the fix, no traceback,
    and Hydra's folder for this job removed when nothing but Hydra's own files
    is in it, with the folders above it that it leaves empty, up to the working
    folder (so a refused run leaves no orphan run folder)."""
    try:
        hydra_cfg = HydraConfig.get()
        job_dir, log = Path(hydra_cfg.runtime.output_dir), f"{hydra_cfg.job.name}.log"
        cwd = Path(hydra_cfg.runtime.cwd).resolve()
    except ValueError:
        job_dir = log = cwd = None
    if job_dir is not None and job_dir.is_dir():
        if {p.name for p in job_dir.iterdir()} <= {".hydra", log}:
            shutil.rmtree(job_dir, ignore_errors=True)
            for parent in job_dir.resolve().parents:
                if parent == cwd or cwd not in parent.parents or any(parent.iterdir()):
                    break
                parent.rmdir()
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)


def run_task(cfg: DictConfig) -> float | None:
    """A run's job: train it; a refusal is one line, an interrupt exits 130."""
    from .callbacks import RunInterrupted
    from .train import train

    try:
        metrics = train(cfg)
    except (ConfigError, DataError) as e:
        refuse(e)
    except RunInterrupted as e:  # exits 130, as shells expect of Ctrl-C, saying what was saved
        print(f"{e}", file=sys.stderr)
        raise
    return metrics.get("val/loss")


#: Hydra's wrapper: a sweep's points (``-m``) and Hydra's own flags
main = hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")(run_task)


def run_once(args: list[str]) -> None:
    """One run with its config composed once, by Hydra's own path for a run (what ``hydra.main``
    does, less its second composition to read the mode): compose, then ``run_job``, which
    makes the run folder, ``.hydra/`` and the log and calls ``run_task``. Overrides that do
    not compose are refused in one line (``explain``), before anything is written, and so are
    settings out of their range (``early_refusal``)."""
    from hydra._internal.callbacks import Callbacks
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_automatic_config_search_path, run_and_report
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import run_job
    from hydra.errors import HydraException
    from hydra.types import HydraContext, RunMode

    plain = run_overrides(args)
    message = not_a_run(plain)
    if message is None:
        search_path = create_automatic_config_search_path(None, __name__, CONFIG_DIR)
        app = Hydra.create_main_hydra2(task_name=JOB_NAME, config_search_path=search_path)
        try:
            cfg = app.compose_config("train", args, run_mode=RunMode.RUN, with_log_configuration=True)
        except HydraException as e:
            GlobalHydra.instance().clear()  # explain composes what did compose, for the closest key
            message = explain(e, plain)
        else:
            message = early_refusal(cfg)
    if message:
        print(message, file=sys.stderr)
        sys.exit(2)
    cfg.hydra.mode = RunMode.RUN
    callbacks = Callbacks(cfg)

    def job() -> None:
        callbacks.on_run_start(config=cfg, config_name="train")
        ret = run_job(hydra_context=HydraContext(config_loader=app.config_loader, callbacks=callbacks),
                      task_function=run_task, config=cfg, job_dir_key="hydra.run.dir", job_subdir_key=None)
        callbacks.on_run_end(config=cfg, config_name="train", job_return=ret)
        _ = ret.return_value  # raises what the job raised

    try:
        run_and_report(job)
    finally:
        GlobalHydra.instance().clear()


def early_refusal(cfg: DictConfig) -> str | None:
    """One line for a setting out of its range, an optimiser's betas, a device the machine lacks
    or an attention route that cannot train here: the checks of ``check_config`` that need
    neither the scheme, the task nor the data, run before Hydra's callbacks import Lightning and
    MLflow (most of a run's start-up: a refusal then takes a few seconds, not a dozen).
    ``check_config`` runs them again with the rest, inside ``train``."""
    try:
        for check in (check_ranges, check_optim, check_device, check_attention):
            check(cfg)
    except ConfigError as e:
        return f"error: {e}"
    return None


def not_a_run(overrides: list[str]) -> str | None:
    """One line for an override of a config folder that is no choice of a run (``executor=gpus``)."""
    for o in overrides:
        group = o.lstrip("+~").split("=", 1)[0].split("/")[0]
        if group in NOT_A_RUN_GROUP and group != "hydra":
            return f"error: {o}: {group} is no setting of a run: {NOT_A_RUN_GROUP[group]}"
    return None


def composition_error(overrides: list[str]) -> str | None:
    """One line for command-line overrides that do not compose (an unknown option of a
    group, a misspelt key with the closest real one, a value of the wrong type, a
    malformed override); ``None`` when they compose. Hydra's own report of these is
    several lines and a traceback; this is what ``cli`` prints instead."""
    from hydra.errors import HydraException

    from .config import compose

    plain = run_overrides(overrides)
    message = not_a_run(plain)
    if message:
        return message
    try:
        compose(plain)
    except HydraException as e:
        return explain(e, plain)
    return None


def explain(e: Exception, plain: list[str]) -> str:
    """One line for a composition error of the run overrides ``plain``."""
    from hydra.errors import MissingConfigException

    if isinstance(e, MissingConfigException):
        found = re.search(r"Could not find '([^/']+)/([^']+)'", str(e))
        if not found:
            return f"error: {str(e).splitlines()[0]}"
        group, name = found.groups()
        found = options(group, config_roots(plain))
        return f"error: {group}={name} is not an option; {did_you_mean(name, found)}available: {', '.join(found)}"
    cause = str(e.__cause__ or "")
    found = re.search(r"Could not override '([^']+)'", str(e))
    if found and "not in struct" in cause:
        return _misspelt(found.group(1), plain)
    key = re.search(r"full_key: (\S+)", cause)
    if key and cause:
        return f"error: {key.group(1)}: {cause.splitlines()[0]}"
    return f"error: {str(e).splitlines()[0]}"


def _is_searchpath(override: str) -> bool:
    return override.lstrip("+~").startswith("hydra.searchpath")


def config_roots(overrides: list[str]) -> list[str]:
    """The config folders a run composes from: the project's, and each ``hydra.searchpath`` adds."""
    return [CONFIG_DIR] + [r for o in overrides if _is_searchpath(o) for r in re.findall(r"file://([^,\]]+)", o)]


def options(group: str, roots: list[str]) -> list[str]:
    """The options of a config group (``<root>/<group>/<option>.yaml``) over ``roots``."""
    return sorted({p.stem for root in roots for p in Path(root, group).glob("*.yaml")})


def run_overrides(overrides: list[str]) -> list[str]:
    """The overrides that compose a run's config: Hydra's own settings are not the run's,
    but its search path decides which options exist."""
    return [o for o in overrides if not o.lstrip("+~").startswith("hydra") or _is_searchpath(o)]


def _misspelt(key: str, overrides: list[str]) -> str:
    """``trainer.max_step=10``: the closest real setting."""
    from .config import compose

    base = compose([o for o in overrides if o.split("=", 1)[0] != key])
    keys = list(tracking.flatten(OmegaConf.to_container(base, resolve=False)))
    value = next(o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == key)
    hint = did_you_mean(key, keys, quote=False, ignore_case=False)
    return f"error: {key} is not a setting; {hint}(to add a new key, write +{key}={value})"


def _null_groups(args: list[str]) -> list[str]:
    """``logger=null`` (any config group set to null) means the group is left out: Hydra's ``~logger``."""
    groups = {p.name for p in Path(CONFIG_DIR).iterdir() if p.is_dir()}
    return [f"~{a.split('=', 1)[0]}" if a.endswith("=null") and a.split("=", 1)[0] in groups else a for a in args]


def sweep_points(args: list[str]) -> list[list[str]]:
    """The overrides of every point of a sweep (``-m``), as Hydra's basic sweeper expands them
    (``encoding=a,b seed=0,1``: four points)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides([a for a in args if not a.startswith("-")])
    points = [point for batch in BasicSweeper.split_arguments(parsed, None) for point in batch]
    return [[o.removesuffix("=null") if o.startswith("~") else o for o in point] for point in points]  # ~logger


def precheck(points: list[list[str]]) -> str | None:
    """One line for the first point whose overrides do not compose or whose settings
    ``check_config`` refuses; ``None`` when every point passes. Run before Hydra writes anything."""
    from .config import check_config, compose

    swept = [o for o in {o for point in points for o in point} if sum(o in p for p in points) < len(points)]
    for i, point in enumerate(points):
        shown = " ".join(o for o in point if o in swept)
        where = f"sweep point {i + 1} of {len(points)} ({shown})" if len(points) > 1 else ""
        message = composition_error(point)
        if message is None:
            plain = run_overrides(point)
            try:
                check_config(compose(plain))
            except ConfigError as e:
                message = f"error: {e}"
        if message:
            return message.replace("error: ", f"error: {where}: ", 1) if where else message
    return None


def cli() -> None:
    """``python train.py``: one run (``run_once``, composed once), or Hydra's ``main`` for a
    sweep and Hydra's flags. Settings that do not compose, or that the checks refuse, stop
    with one line (exit 2, as every refusal) and leave no run folder; a sweep (``-m``) is
    checked point by point first, so a refused point leaves no multirun folder. Other flags
    keep Hydra's own handling; ``--help`` lists the groups a run takes."""
    sys.argv[1:] = _null_groups(sys.argv[1:])
    if not any(a.lstrip("+~").split("=", 1)[0] == "hydra.job.name" for a in sys.argv[1:]):
        # beside the user's overrides: Hydra's parser takes them as one run of arguments, so an override
        # after a flag (`encoding=alibi --cfg job hydra.job.name=...`) would be refused
        at = next((i for i, a in enumerate(sys.argv[1:], 1) if not a.startswith("-") and ("=" in a or a[:1] in "~+")),
                  len(sys.argv))
        sys.argv.insert(at, f"hydra.job.name={JOB_NAME}")
    args = sys.argv[1:]
    flags = [a for a in args if a.startswith("-")]
    if set(flags) & {"--help", "-h"}:
        overrides = [a for a in args if not a.startswith("-")]
        message = composition_error(overrides)
        print(message or help_text(overrides), file=sys.stderr if message else sys.stdout)
        sys.exit(2 if message else 0)
    if not flags:
        run_once(args)
        return
    if set(flags) <= {"-m", "--multirun"}:
        message = precheck(sweep_points(args))
        if message:
            print(message, file=sys.stderr)
            sys.exit(2)
    main()


if __name__ == "__main__":
    cli()
