"""A real SGLang server for the tests and the side-by-side benchmark: where the pinned SGLang lives
(tests/e2e/sglang/install.sh), a checkpoint both engines load (made from the embedded model), and a
server on loopback started and stopped by its PID.

Why the checkpoint is not the embedded model itself (docs/sglang.md, "Running SGLang on a CPU"):
- SGLang 0.5.23 takes LLaDA2's mask id from a table (srt/dllm/config.py: 156895 for LLaDA2MoeModelLM),
  not from config.json: the vocabulary grows to 156,896 rows with the mask at 156895. The new embedding
  rows are zeros (no prompt holds them) but the mask's, which is the old mask's row; the new head rows
  are copies of the old mask's head row, whose logit is >= 15 below the best at every position measured,
  so no new id is ever chosen and the softmax mass they add is ~1e-6 of the top's.
- SGLang's CPU MoE (fused_moe_native) never applies routed_scaling_factor: the factor is folded into
  the routed experts' down_proj and config.json says 1.0, which both engines then agree on.
- transformers does not know `llada2_moe`: a configuration_llada2_moe.py and an auto_map entry, which
  SGLang loads with --trust-remote-code (the native loader has its own config class and runs no code).

Plain stdlib at import (torch and safetensors inside make_checkpoint): the test module imports it
before it knows whether SGLang is installed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

SGLANG_VERSION = "0.5.23"
ROOT = Path(__file__).resolve().parents[3]
INSTALL = Path(__file__).with_name("install.sh")
SGLANG_MASK_ID = 156895  # srt/dllm/config.py's fixed mask id for LLaDA2MoeModelLM
VOCAB = SGLANG_MASK_ID + 1

CONFIG_CLASS = '''"""LLaDA2's config class for transformers' AutoConfig (auto_map), as real checkpoints bring theirs:
transformers does not know model_type llada2_moe."""

from transformers import PretrainedConfig


class LLaDA2MoeConfig(PretrainedConfig):
    model_type = "llada2_moe"

    def __init__(self, **kwargs):
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)
'''


def sglang_home() -> Path:
    return Path(os.environ.get("LLADA_SGLANG_HOME", Path.home() / ".cache" / "llada-lsp" / f"sglang-{SGLANG_VERSION}"))


def sglang_python() -> tuple[Path | None, str]:
    """The python of the installed SGLang venv, or None and why not (the tests skip with it)."""
    given = os.environ.get("LLADA_SGLANG_PYTHON")
    if given:
        path = Path(given)
        return (path, "") if path.is_file() else (None, f"LLADA_SGLANG_PYTHON={given} does not exist")
    venv = sglang_home() / "venv"
    if (venv / ".complete").is_file() and (venv / "bin" / "python").is_file():
        return venv / "bin" / "python", ""
    return None, (f"SGLang {SGLANG_VERSION} is not installed in {venv}: run bash {INSTALL.relative_to(ROOT)} "
                  "(about 4 minutes and 6.3 GB; .ci/run does it, best effort)")  # fmt: skip


# --- the checkpoint -------------------------------------------------------------------------------------
def make_checkpoint(out: Path, source: Path | None = None) -> Path:
    """The embedded model (or `source`) as a checkpoint SGLang 0.5.23 runs on a CPU (module docstring),
    in float32, in `out` (about 1.2 GB). Returns `out`."""
    import torch
    from safetensors.torch import load_file, save_file

    from llada_lsp.model.files import EMBEDDED_MODEL

    source = Path(source or EMBEDDED_MODEL)
    config = json.loads((source / "config.json").read_text())
    old_mask, old_vocab = config["mask_token_id"], config["vocab_size"]
    scale = float(config.get("routed_scaling_factor") or 1.0)
    state = {name: t.to(torch.float32) for name, t in load_file(str(source / "model.safetensors")).items()}
    for name, t in state.items():
        if ".mlp.experts." in name and name.endswith("down_proj.weight"):
            state[name] = t * scale
    emb = state["model.word_embeddings.weight"]
    head = state["lm_head.weight"]
    new_emb = torch.zeros(VOCAB, emb.shape[1], dtype=emb.dtype)
    new_emb[:old_vocab] = emb
    new_emb[SGLANG_MASK_ID] = emb[old_mask]
    new_head = head[old_mask].expand(VOCAB, -1).clone()
    new_head[:old_vocab] = head
    state["model.word_embeddings.weight"], state["lm_head.weight"] = new_emb, new_head
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.update(vocab_size=VOCAB, mask_token_id=SGLANG_MASK_ID, routed_scaling_factor=1.0, dtype="float32",
                  auto_map={"AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig"})  # fmt: skip
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "configuration_llada2_moe.py").write_text(CONFIG_CLASS)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, out / name)
    return out


# --- the server -----------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def algorithm_config(threshold: float, edit_threshold: float, block_size: int = 32) -> str:
    """SGLang's --dllm-algorithm-config for JointThreshold (the keys llada_lsp's plan --sglang writes)."""
    return (f"threshold: {threshold}\nedit_threshold: {edit_threshold}\nmax_post_edit_steps: 16\n"
            f"penalty_lambda: 0\nblock_size: {block_size}\n")  # fmt: skip


def server_argv(python: Path, model: Path, port: int, algo_file: Path, fdfo: bool, algorithm: str = "JointThreshold",
                max_running: int = 1) -> list[str]:  # fmt: skip
    """The CPU launch command docs/sglang.md gives ("Running SGLang on a CPU")."""
    return [str(python), "-m", "sglang.launch_server", "--model-path", str(model), "--trust-remote-code",
            "--device", "cpu", "--attention-backend", "torch_native", "--dtype", "float32",
            "--dllm-algorithm", algorithm, "--dllm-algorithm-config", str(algo_file),
            "--dllm-fdfo" if fdfo else "--no-dllm-fdfo", "--max-running-requests", str(max_running),
            "--max-total-tokens", "16384", "--sleep-on-idle", "--skip-server-warmup",
            "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip


@dataclass
class Server:
    """One SGLang server process (its own process group, so its scheduler dies with it)."""

    argv: list[str]
    port: int
    log: Path
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Server:
        env = dict(os.environ, SGLANG_USE_CPU_ENGINE="1", PYTHONPATH="", TOKENIZERS_PARALLELISM="false",
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", NO_PROXY="127.0.0.1,localhost")  # fmt: skip
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        return self

    def wait_ready(self, timeout: float = 600.0) -> None:
        """Until /health answers 200 (SGLang opens the port once the weights are loaded). RuntimeError
        with the log's tail if it exits or takes longer."""
        deadline = time.monotonic() + timeout
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"SGLang exited ({self.process and self.process.returncode}):\n{self.tail()}")
            try:
                with opener.open(f"{self.url}/health", timeout=5) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"SGLang was not ready within {timeout:.0f} s:\n{self.tail()}")

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after 20 s."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL to the whole group at once: SGLang dying mid-request."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def start_server(python: Path, model: Path, folder: Path, *, threshold: float, edit_threshold: float,
                 fdfo: bool, port: int | None = None, name: str = "sglang", max_running: int = 1) -> Server:  # fmt: skip
    """A server for `model` with the thresholds given, its files in `folder`; started, not waited for."""
    algo = folder / f"{name}.yaml"
    algo.write_text(algorithm_config(threshold, edit_threshold))
    port = port or free_port()
    argv = server_argv(python, model, port, algo, fdfo, max_running=max_running)
    return Server(argv, port, folder / f"{name}.log").start()


if __name__ == "__main__":  # python tests/e2e/sglang/sglang_harness.py OUT: the checkpoint alone
    print(make_checkpoint(Path(sys.argv[1])))
