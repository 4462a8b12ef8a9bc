"""Reading the metrics files the trainers write (shared by the end-to-end tests)."""

import json
from pathlib import Path


def read_jsonl(path):
    """All records of a JSON-lines file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def strip_times(records):
    """The records without their wall-clock fields, for comparing two runs."""
    return [{k: v for k, v in r.items() if k not in ("time_s", "unix_time")} for r in records]
