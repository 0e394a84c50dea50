"""``store rm RUN_ID``: take a stored run out of the cost store, with all that hangs on it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from ray_layout.commands.common import Command, emit, json_flag
from ray_layout.commands.flags import Settings
from ray_layout.measure.store import CostStore
from ray_layout.options.checks import plain_name
from ray_layout.options.flag_fields import argument, option

ACTIONS = ("rm",)


def _action(value: str) -> str | None:
    return None if value in ACTIONS else f"must be one of {', '.join(ACTIONS)}, not {value[:80]!r}"


def _store_folder(value: str) -> str | None:
    """The store must be there: removing from a folder that does not exist is a typo."""
    return None if Path(value).is_dir() else f"{value[:200]}: no such folder"


@dataclass(frozen=True, kw_only=True)
class StoreSettings(Settings):
    action: str = argument(help="rm: remove a stored run", checks=[_action])
    run_id: str = argument(help="the run's id (run-…), as ingest and fit name it")
    store: str = option(help="the cost store folder", checks=[_store_folder])
    study: str = option("default", help="study id (default: default)", checks=[plain_name])
    dry_run: bool = option(False, help="say what would be removed, remove nothing")
    as_json: bool = json_flag()


def run_store(settings: StoreSettings, console: Console) -> None:
    store = CostStore(settings.store)
    removed = store.remove_run(settings.study, settings.run_id, dry_run=settings.dry_run)
    report = {"run_id": settings.run_id, "dry_run": settings.dry_run, "rows": removed}
    emit(report, settings.as_json, _print_removed, console)


def _print_removed(report: dict[str, Any], console: Console) -> None:
    verb = "would remove" if report["dry_run"] else "removed"
    rows = ", ".join(f"{table} {count}" for table, count in report["rows"].items() if count)
    console.print(f"{report['run_id']}: {verb} rows of {rows}", highlight=False, markup=False)


STORE = Command(
    "store", "remove a run from the cost store (store rm RUN_ID)", StoreSettings, run_store
)
