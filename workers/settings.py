"""Typed settings of an inference worker (`RAGWARM_WORKER_*`): engine, KV cache, and service."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from workers.calibration import DEFAULT_SELECTION, ReuseMode, reuse_mode
from workers.engine_lock import DEFAULT_BACKGROUND_MAX_WAIT_S
from workers.kv.blocks import BLOCK_SIZE
from workers.kv.eviction import DEFAULT_POLICY, make_policy
from workers.kv.memory import DEFAULT_MAX_ENTRIES, GiB
from workers.kv.request_blocks import DEFAULT_REQUEST_CACHING
from workers.synthesis import DEFAULT_PER_MINUTE

# The host tier's default size per byte of device KV budget. A GPU server's host RAM is
# several times its GPU memory, and KV held there is read back far faster than recomputed;
# an edit re-warms its other dependents into it (streams `edit_rewarm_rest`). Sweeps of
# 2026-12-06 (docs/lab/2026-12-06-rewarm-rest.md): at 1x, Prometheus's post-edit hits fell
# to 76% with those re-warms; at 2x, Poetry's (whose budget holds two prompts) reached 69%;
# at 4x, 100% on the three traces.
HOST_TIER_PER_KV_BYTE = 4

# The names workers.engines.blend.SELECTORS accepts (kept here so settings import no torch).
ChunkSelection = Literal["hkvd", "attn", "sink", "sink+hkvd", "sink+attn", "tail"]


class WorkerSettings(BaseSettings):
    """One worker: which device and precision the engine runs in, and its KV-cache bounds."""

    model_config = SettingsConfigDict(env_prefix="RAGWARM_WORKER_", extra="forbid")

    engine: str = Field(default="torch", description="Engine name: `torch` (transformers).")
    model_id: str | None = Field(
        default=None,
        description="Model name salting the prefix hashes. Unset, `ragwarm worker` uses "
        "RAGWARM_MODEL_LLM_NAME (the name the streams app hashes with); an engine loaded "
        "directly uses its model directory name. Every component hashing prompts for this "
        "model must use the same value.",
    )
    device: Literal["cpu", "cuda", "auto"] = Field(
        default="auto", description="Where the torch engine runs; `auto` picks CUDA when present."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto",
        description="Weights and computation precision; `auto` is float32 on CPU, bf16 on CUDA.",
    )
    kv_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto",
        description="Precision cached KV is stored in (computation keeps `dtype`); `auto` is "
        "float16 where the model computes in float32 (`bench kv-precision`: the same answers "
        "in half the bytes, so every budget holds twice the prompts), else the model's dtype.",
    )
    threads: int | None = Field(
        default=None, ge=1, description="torch CPU threads; all cores when unset."
    )
    block_size: int = Field(
        default=BLOCK_SIZE,
        ge=1,
        description="Tokens per hashed block; prefixes are stored whole blocks.",
    )
    kv_bytes: int = Field(
        default=2 * GiB, ge=0, description="Cap on the bytes of KV held by cached prefixes."
    )
    max_entries: int = Field(
        default=DEFAULT_MAX_ENTRIES, ge=0, description="Cap on the number of cached prefixes."
    )
    eviction_policy: str = Field(
        default=DEFAULT_POLICY,
        description="Which unpinned prefix goes first: slru (those never hit again first, "
        "then least recently used), lru, lfu-aged or gdsf.",
    )
    request_caching: Literal["block", "entry"] = Field(
        default=DEFAULT_REQUEST_CACHING,
        description="How request caching (the prompts a worker keeps unpinned, without a TTL) "
        "evicts: block (one block at a time, a prompt's last first; a hit touches every block "
        "along the match, as vLLM's prefix caching) or entry (a prompt at once).",
    )
    ttl_s: float = Field(
        default=3600.0, gt=0, description="Lifetime of a cached prefix unless a command sets one."
    )
    max_ttl_s: float = Field(
        default=86400.0, gt=0,
        description="Longest lease (TTL, and so pin) a prefill or a TTL extension gets, from "
        "POST /v1/prefill or a command alike; a longer one asked is cut to it.",
    )
    tenant_share: float = Field(
        default=1.0, gt=0, le=1,
        description="Share of the pinned budget and of the cache that one tenant's pinned and "
        "TTL-held KV may take (a prefill over it is refused, 409); 1.0: no per-tenant quota. "
        "Set it below 1 where tenants share workers.",
    )
    prefill_chunk_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Tokens per forward pass when prefilling a long prompt (chunked prefill: "
        "bounded activation memory; a request waiting for the engine goes between a "
        "warmup's passes). Unset, by device class (seed 000): A10G-class cards "
        "(<= 24 GiB) 768, 24-40 GiB 1,024, A100-80G-class 1,536, CPU 512.",
    )
    background_max_wait_s: float = Field(
        default=DEFAULT_BACKGROUND_MAX_WAIT_S,
        gt=0,
        description="Requests go before warmups, invalidations and TTL expiry, but background "
        "work that has waited this many seconds takes the engine ahead of them for one turn "
        "(a warmup pass or a command), so a worker under back-to-back requests still applies "
        "its commands. A very large value makes background work wait for a gap in requests.",
    )
    boot_warmup: bool = Field(
        default=True,
        description="Before reporting ready, run one throwaway request through the freshly "
        "loaded model (torch engine): a prompt of the seed's warmup token amount, min(context "
        "x 25%, memory_bandwidth / (weight bytes x 2)), plus the quantization extra (AWQ +12%, "
        "GPTQ +8%), then the first decode step, so the first real request does not pay the "
        "first pass's one-time costs (CUDA context, library handles, lazily loaded kernels; "
        "small on a CPU). Nothing of it is cached.",
    )
    memory_bandwidth: float | None = Field(
        default=None,
        gt=0,
        description="Bytes per second of the device's memory, the bandwidth term of the warmup "
        "token amount. Unset, by device class: CPU 51.2e9, <= 24 GiB cards 600e9 (A10G), "
        "24-40 GiB 1.555e12 (A100-40GB), larger 2.039e12 (A100-80G).",
    )
    disk_tier: bool = Field(
        default=False,
        description="Keep a disk KV tier below device memory (torch engine): warm prefixes are "
        "written through, evicted blocks spill there, hits are read back when that beats "
        "recomputing, and a restarted worker serves them at once. Off by default: it costs a "
        "disk write per warmup and disk space, and it only pays where reading beats "
        "prefilling (`ragwarm bench engine` reports restore_ms beside cold_ms).",
    )
    disk_tier_path: Path | None = Field(
        default=None,
        description="Directory of the disk tier; RAGWARM_HOME/kv-tier/<worker_id> if unset. "
        "One directory per worker: two processes must never share one.",
    )
    disk_tier_bytes: int = Field(
        default=16 * GiB, ge=0, description="Cap on the bytes of KV the disk tier holds."
    )
    restore_tier: bool = Field(
        default=True,
        description="At start, read the disk tier's prefixes back into device memory (most "
        "recently used first, up to the warmup threshold) after the invalidations sent while "
        "down have run, so they are warm again before the worker reports ready.",
    )
    host_tier_bytes: int | None = Field(
        default=None,
        ge=0,
        description="Bytes of host memory for a KV tier below the device budget (torch "
        "engine): evicted blocks spill there and hits read them back when that beats "
        "recomputing (`ragwarm bench engine --tier host` reports its restore_ms). Unset: four "
        "times RAGWARM_WORKER_KV_BYTES (on a GPU, host RAM is the larger and cheaper memory; "
        "on a CPU the tier is a second budget of the same RAM). 0: none. One tier at a time: "
        "with RAGWARM_WORKER_DISK_TIER on, the disk tier is used instead.",
    )

    @property
    def host_tier_size(self) -> int:
        """The host tier's bytes in effect (`host_tier_bytes`; unset, `HOST_TIER_PER_KV_BYTE`
        times the device budget)."""
        return self.host_tier_for(self.kv_bytes)

    def host_tier_for(self, kv_bytes: int) -> int:
        """The host tier beside a device budget of `kv_bytes`: `host_tier_bytes`, unset
        `HOST_TIER_PER_KV_BYTE` times that budget (the bench sizes its runs' tiers so)."""
        if self.host_tier_bytes is None:
            return HOST_TIER_PER_KV_BYTE * kv_bytes
        return self.host_tier_bytes

    # -- service: HTTP API, commands and events (workers/service.py, ragwarm/cli/worker.py)
    worker_id: str = Field(
        default_factory=socket.gethostname,
        description="This worker's id: key of its events, target of commands; the host name.",
    )
    node: str = Field(
        default_factory=socket.gethostname,
        description="The machine this worker runs on, reported in its events: the streams "
        "app keeps the hot set on at least one ready worker of every node (seed 000: keep >= 1 "
        "hot instance per node). The host name; set it to the node's name in a pod.",
    )
    host: str = Field(default="127.0.0.1", description="Address the HTTP API listens on.")
    port: int = Field(default=8000, ge=0, le=65535, description="Port of the HTTP API.")
    advertise_url: str | None = Field(
        default=None, description="Base URL announced in events; http://<host>:<port> if unset."
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="Operator bearer token (every tenant), required on /v1/* and /metrics "
        "(not /health/*) when set.",
    )
    events_secret: SecretStr | None = Field(
        default=None,
        description="This worker's own key signing its events (HMAC-SHA256): `ragwarm keys "
        "worker-key --worker-id ID`, derived from the streams app's "
        "RAGWARM_STREAMS_WORKER_EVENTS_SECRET, which then ignores unsigned or forged events.",
    )
    commands_key: SecretStr | None = Field(
        default=None,
        description="Key verifying warmup commands (`ragwarm keys commands-key`, derived from "
        "the same streams secret): with one, unsigned or badly signed commands are refused, "
        "counted and dead-lettered.",
    )
    tenant_keys: dict[str, SecretStr] = Field(
        default_factory=dict,
        description='Tenant-bound bearer tokens as JSON, {"tenant": "key"} ("*": every tenant); '
        "a request cannot claim a tenant its key does not grant.",
    )
    max_prompt_tokens: int = Field(default=4096, ge=1, description="Longest prompt accepted.")
    max_tokens: int = Field(default=512, ge=1, description="Largest max_tokens accepted.")
    max_body_bytes: int = Field(default=1 << 20, ge=1024, description="Largest request body.")
    cache_requests: bool = Field(
        default=True,
        description="After a completion, cache its prompt's full blocks unpinned (reactive, "
        "like vLLM automatic prefix caching).",
    )
    synthetic_per_minute: float = Field(
        default=DEFAULT_PER_MINUTE,
        ge=0,
        description="Synthetic warmup: `synthesize` commands (a few questions sampled by the "
        "model) carried out per minute at most, two at once; 0 refuses them all. Only sent "
        "when the streams app has RAGWARM_STREAMS_SYNTHETIC on.",
    )
    synthetic_share: float = Field(
        default=0.05,
        gt=0,
        le=0.05,
        description="Synthetic warmup: most KV memory one sampled question may hold (prompt and "
        "new tokens), as a share of the KV budget (seed 000: under 5%).",
    )
    chunk_reuse: ReuseMode = Field(
        default="auto",
        description="Serve prompts no cached prefix covers from held chunk KV (re-rotated, a "
        "share recomputed). `auto`: only for a model whose stored calibration passes the "
        "quality gate (`ragwarm bench blend --calibrate`); `on`: always, with a warning; "
        "`off`: never. true/false mean on/off.",
    )
    chunk_recompute_share: float = Field(
        default=0.3,
        ge=0.0,
        le=1.0,
        description="Share of moved chunk tokens recomputed when blending chunk KV. Unset, the "
        "calibration's chosen share (this default where there is none).",
    )
    chunk_calibration: Path | None = Field(
        default=None,
        description="Blend calibration file to read; unset, the one stored for the model "
        "(workers/calibrations/<model>.json).",
    )
    chunk_selection: ChunkSelection = Field(
        default=DEFAULT_SELECTION,
        description="How recomputed tokens are chosen: hkvd (KV deviation), attn (question "
        "attention), sink (each chunk's first tokens), sink+ one of the scores, or tail (the "
        "last chunk whole, then the others' first tokens).",
    )
    chunk_blend_gate: bool = Field(
        default=True,
        description="With chunk reuse on, blend a prompt only where the worker's cost estimate "
        "(learned from its own prefill and blend timings) says it beats computing it. Off: "
        "every prompt with held chunk KV is blended (tests, calibration).",
    )
    warm_set: Path | None = Field(
        default=None,
        description="JSON or JSONL file of prefixes (token_ids or prompt, tenant, chunk_refs, "
        "ttl_s, pin) prefilled before the worker reports ready.",
    )
    heartbeat_s: float = Field(default=5.0, gt=0, description="Seconds between heartbeats.")
    kafka: bool = Field(
        default=True, description="Consume warmup.commands and publish worker.events."
    )
    broker_wait_s: float = Field(
        default=300.0, ge=0, description="How long start-up retries a broker that does not "
        "answer (it may be starting too) before the worker gives up."
    )
    remote_url: str | None = Field(
        default=None, description="Engine `remote`: base URL of an OpenAI-compatible server."
    )
    remote_api_key: SecretStr | None = Field(
        default=None, description="Engine `remote`: bearer token of that server."
    )
    remote_model: str | None = Field(
        default=None, description="Engine `remote`: served model name; the first one if unset."
    )
    remote_timeout_s: float = Field(default=120.0, gt=0, description="Engine `remote`: timeout.")
    remote_erase_slots: bool = Field(
        default=False,
        description="Engine `remote` on llama.cpp's server: erase the slots holding a prefix "
        "ragwarm dropped (the server needs --slot-save-path).",
    )
    vllm_gpu_memory_utilization: float = Field(
        default=0.85, gt=0, le=1, description="Engine `vllm`: share of GPU memory vLLM may use."
    )
    vllm_max_model_len: int | None = Field(
        default=None, ge=1, description="Engine `vllm`: context length; the model's if unset."
    )

    @field_validator("chunk_reuse", mode="before")
    @classmethod
    def _reuse_mode(cls, value: object) -> ReuseMode:
        return reuse_mode(value)  # true/false (the old boolean setting) mean on/off

    @field_validator("eviction_policy")
    @classmethod
    def _known_policy(cls, name: str) -> str:
        make_policy(name)  # raises with the list of valid names
        return name
