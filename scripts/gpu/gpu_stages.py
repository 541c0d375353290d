"""Running a device run's stages (scripts/gpu/session.py's experiment): each a subprocess (or several at once)
under a time limit within the run's deadline, its log and exit recorded, and the results archive rewritten into
OUT after every stage, so a run cut short still gives back what it finished."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from gpu_transport import ROOT


class StageRunner:
    def __init__(self, out: Path, stash: Path, deadline: float, record: dict, site: Path) -> None:
        """`record`: what status.json says of the run (its profile); `site`: the packages the payload brought."""
        self.start, self.out, self.stash, self.deadline, self.record = time.monotonic(), out, stash, deadline, record
        self.results = stash / "results"
        self.results.mkdir(parents=True, exist_ok=True)
        self.status: dict[str, dict] = {}
        sys.path[:0] = [str(ROOT), str(site)]  # this process packs drafters with portable_spec and safetensors
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)]),
            "PYTHONUNBUFFERED": "1",
            "PORTABLE_SPEC_CACHE": str(stash / "cache"),
            "TOKENIZERS_PARALLELISM": "false",
        }

    def left(self) -> float:
        return self.deadline - (time.monotonic() - self.start)

    def stage(self, name: str, commands: list[list[str]], limit: float) -> bool:
        """Run `commands` at once (several: concurrently), at most `limit` seconds; record and publish."""
        limit = max(min(limit, self.left()), 1.0)
        began = time.monotonic()
        names = [f"{name}.log"] if len(commands) == 1 else [f"{name}-{i}.log" for i in range(len(commands))]
        codes: list[int | str] = []
        with contextlib.ExitStack() as stack:
            logs = [stack.enter_context(open(self.results / log, "w")) for log in names]
            procs = [
                subprocess.Popen(c, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
                for c, log in zip(commands, logs)
            ]
            for proc in procs:
                try:
                    codes.append(proc.wait(timeout=max(limit - (time.monotonic() - began), 0.1)))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    codes.append("timeout")
        self.status[name] = {"exit": codes, "seconds": round(time.monotonic() - began, 1), "limit": round(limit)}
        print(f"{name}: {codes} in {self.status[name]['seconds']} s (limit {round(limit)} s)", flush=True)
        self.publish()
        return all(code == 0 for code in codes)

    def publish(self) -> None:
        """OUT/results.tar.gz (logs, tables, curves, status), rewritten after every stage."""
        (self.results / "status.json").write_text(
            json.dumps(
                {
                    "profile": self.record,
                    "elapsed": round(time.monotonic() - self.start, 1),
                    "stages": self.status,
                },
                indent=1,
            )
            + "\n"
        )
        self.out.mkdir(parents=True, exist_ok=True)
        tmp = self.out / "results.tar.gz.tmp"
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(self.results, arcname="results")
        tmp.replace(self.out / "results.tar.gz")

    def cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "portable_spec.cli", *args]
