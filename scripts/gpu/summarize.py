"""One markdown table + JSON from scripts/gpu/run_all.sh's step reports (OUT/<step>.status.json, OUT/<step>.json,
OUT/<step>.log). A step that failed or timed out is a row that says so, with the last line of its log."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

COLUMNS = ("step", "result", "seconds", "figures")


def _figures(report: dict) -> str:
    """Top-level numbers and booleans of a step's JSON report, as `key=value` pairs."""
    shown = [
        f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
        for k, v in report.items()
        if isinstance(v, (int, float, bool)) and not isinstance(v, str)
    ]
    return ", ".join(shown[:10]) or "-"


def summarize(out: Path) -> tuple[str, list[dict]]:
    rows = []
    for status_file in sorted(out.glob("*.status.json")):
        status = json.loads(status_file.read_text())
        name = status["step"]
        report_file = out / f"{name}.json"
        report = json.loads(report_file.read_text()) if report_file.exists() else {}
        log = out / f"{name}.log"
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
        result = (
            "pass" if status["rc"] == 0 else ("timed out" if status["rc"] == 124 else f"FAILED (exit {status['rc']})")
        )
        if status["rc"] != 0 and tail:
            result += f": {tail[0][:160]}"
        rows.append(
            {
                "step": name,
                "result": result,
                "seconds": status["seconds"],
                "figures": _figures(report),
                "report": report,
            }
        )
    device = (out / "device.txt").read_text().strip() if (out / "device.txt").exists() else "unknown device"
    lines = [f"GPU run on {device}", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(row[c]) for c in COLUMNS) + " |" for row in rows]
    return "\n".join(lines) + "\n", rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("gpu-results"))
    parser.add_argument("--check-only", action="store_true", help="Validate this script's own table on a sample.")
    args = parser.parse_args()
    if args.check_only:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            sample = Path(tmp)
            (sample / "a.status.json").write_text(json.dumps({"step": "a", "rc": 0, "seconds": 3}))
            (sample / "a.json").write_text(json.dumps({"tau": 2.5, "greedy_equal": True}))
            (sample / "b.status.json").write_text(json.dumps({"step": "b", "rc": 124, "seconds": 300}))
            (sample / "b.log").write_text("starting\nstill going\n")
            table, rows = summarize(sample)
            if rows[0]["result"] != "pass" or "tau=2.5" not in table or not rows[1]["result"].startswith("timed out"):
                print(f"error: summarize.py produced a wrong table:\n{table}")
                return 1
        print("  summarize.py: ok")
        return 0
    table, rows = summarize(args.out)
    (args.out / "summary.md").write_text(table)
    (args.out / "summary.json").write_text(json.dumps(rows, indent=1))
    print(table)
    return 0 if rows and all(r["result"] == "pass" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
