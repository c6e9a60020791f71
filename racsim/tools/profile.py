"""``racsim-profile``: measure a reward model's forward passes, write the CSV the
``profiled`` service model reads (racsim/pipeline/service.py).

    racsim-profile                                   # tiny random Llama RM, CPU/CUDA, default grid
    racsim-profile out=outputs/h100_8b.csv rm.checkpoint=/models/my-rm batch_sizes=[1,8,32] seq_lens=[256,512,1024]

A transformers sequence-classification model (one score per sequence) runs
real forward passes with torch on the local device (CUDA when present, else
the CPU) over a grid of batch sizes x sequence lengths (random token ids,
full attention masks, no padding); each cell is timed ``repeats`` times after
``warmup`` untimed passes and its fastest time written (the least disturbed by
other work on the machine; the median beside it), with the device, dtype,
model and library versions in '#' header lines. The default model is a small
Llama-shaped config with random weights built in code: no download, no
network. ``rm.checkpoint=PATH`` loads a local checkpoint instead (offline).
Before writing, the measurements are checked: the time must grow with the batch
and the length within the spread of the repeats (else nothing is written).
"""

# torch and transformers are imported inside the functions below only (the ``rm`` extra), so
# ``import racsim`` never needs them.

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, List, Optional, Tuple

from racsim.config.names import closest
from racsim.errors import ConfigError, interruptible, say, write_failure
from racsim.io import write_text
from racsim.sweep.markers import foreign, publish


@dataclass
class TinyModelConf:
    """The default model: a Llama-shaped RM small enough to profile in seconds on a CPU."""

    layers: int = 2
    d_model: int = 128
    d_ff: int = 256
    n_heads: int = 4
    n_kv_heads: int = 2
    vocab: int = 1024


@dataclass
class ProfileRMConf:
    checkpoint: Optional[str] = None
    model: TinyModelConf = field(default_factory=TinyModelConf)


@dataclass
class ProfileConf:
    out: str = "outputs/rm_profile.csv"  # beside racsim's runs, not in the folder it is run from
    rm: ProfileRMConf = field(default_factory=ProfileRMConf)
    batch_sizes: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    seq_lens: List[int] = field(default_factory=lambda: [32, 64, 128, 256, 512])
    repeats: int = 3
    warmup: int = 1
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16 | float16
    threads: Optional[int] = None
    seed: int = 0


def keys(node: Any = None, prefix: str = "") -> List[Tuple[str, Any]]:
    """(dotted key, default) of every setting of :class:`ProfileConf`."""
    out: List[Tuple[str, Any]] = []
    for f in fields(node or ProfileConf()):
        value = getattr(node or ProfileConf(), f.name)
        out += keys(value, f"{prefix}{f.name}.") if is_dataclass(value) else [(prefix + f.name, value)]
    return out


def help_text() -> str:
    """``racsim-profile --help``: what it does, then every key with its default."""
    width = max(len(k) for k, _ in keys()) + 2
    lines = [__doc__.rstrip(), "", "Keys (key=value; the defaults):"]
    lines += [f"  {k:<{width}}{v!r}" if v is not None else f"  {k:<{width}}null" for k, v in keys()]
    return "\n".join(lines)


def _unknown(key: str) -> str:
    near = closest(key, [k for k, _ in keys()])
    return f"no such key; {'did you mean ' + ' or '.join(near) + '?' if near else 'racsim-profile --help lists them'}"


def parse(argv: List[str]) -> ProfileConf:
    """key=value overrides onto :class:`ProfileConf` (typed by OmegaConf)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    base = OmegaConf.structured(ProfileConf)
    for a in argv:
        if "=" not in a:  # an argument with no value: an option it does not have, or a key alone
            what = "no such option" if a.startswith("-") else "a key with no value"
            raise ConfigError(a, None, "", line=f"{a}: {what} (racsim-profile takes key=value, e.g. "
                                                "batch_sizes=[1,4,16], and --help)")
    known = {k for k, _ in keys()} | {"rm", "rm.model"}
    for a in argv:
        key = a.split("=", 1)[0]
        if key not in known:
            raise ConfigError(key, None, _unknown(key), line=f"{key}: {_unknown(key)}")
    try:
        cfg = OmegaConf.merge(base, OmegaConf.from_dotlist(list(argv)))
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        raise ConfigError(str(key), None, str(e).splitlines()[0]) from e
    conf: ProfileConf = OmegaConf.to_object(cfg)
    for k in ("batch_sizes", "seq_lens"):
        v = list(getattr(conf, k))
        if not v or any(not isinstance(x, int) or x < 1 for x in v):
            raise ConfigError(k, v, "a non-empty list of integers >= 1")
    if conf.repeats < 1:
        raise ConfigError("repeats", conf.repeats, "an integer >= 1")
    if conf.warmup < 0:
        raise ConfigError("warmup", conf.warmup, "an integer >= 0")
    if conf.dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise ConfigError("dtype", conf.dtype, "one of auto, float32, bfloat16, float16")
    for k, most in (("batch_sizes", MAX_BATCH), ("seq_lens", MAX_SEQ)):
        if max(getattr(conf, k)) > most:
            raise ConfigError(k, list(getattr(conf, k)), f"integers <= {most} (one forward pass must fit memory)")
    for k, low in (("repeats", 1), ("warmup", 0)):
        if getattr(conf, k) > MAX_REPEATS:
            raise ConfigError(k, getattr(conf, k), f"an integer in [{low}, {MAX_REPEATS}]")
    if not 0 <= conf.seed < 2**63:
        raise ConfigError("seed", conf.seed, "an integer in [0, 2**63)")
    if not conf.rm.checkpoint:
        check_model(conf.rm.model)
    out = Path(str(conf.out))
    above = next((d for d in out.parents if d.exists()), Path("."))
    if out.is_dir() or not above.is_dir() or not os.access(above, os.W_OK):
        raise ConfigError("out", conf.out, "the path of a CSV file to write, in a folder you can write to")
    if foreign(out.parent, [out.name]):
        raise ConfigError("out", conf.out, "a file racsim-profile may write: this one is not a profile it wrote (or "
                                           "it changed since); choose another name, or remove it")
    return conf


def check_model(m: TinyModelConf) -> None:
    """The built-in model's shape: sizes >= 1, heads that split d_model into even head sizes
    (rotary embeddings rotate pairs), key-value heads that divide the heads, two tokens or more."""
    for k in ("layers", "d_model", "d_ff", "n_heads", "n_kv_heads"):
        if getattr(m, k) < 1:
            raise ConfigError(f"rm.model.{k}", getattr(m, k), "an integer >= 1")
    if m.d_model % m.n_heads or (m.d_model // m.n_heads) % 2:
        raise ConfigError("rm.model.n_heads", m.n_heads, f"a divisor of rm.model.d_model={m.d_model} that leaves "
                                                         f"an even head size (d_model / n_heads)")
    if m.n_heads % m.n_kv_heads:
        raise ConfigError("rm.model.n_kv_heads", m.n_kv_heads, f"a divisor of rm.model.n_heads={m.n_heads}")
    if m.vocab < 2:
        raise ConfigError("rm.model.vocab", m.vocab, "an integer >= 2 (token 0 pads; the others are drawn)")


MAX_BATCH, MAX_SEQ, MAX_REPEATS = 4096, 131072, 1000  # sizes past these are a typo, not a profile


def build_model(conf: ProfileConf, dtype, device):
    """(model, description, vocab size) on ``device`` in ``dtype``, in eval mode."""
    import torch
    from transformers import (
        AutoModelForSequenceClassification,
        LlamaConfig,
        LlamaForSequenceClassification,
    )

    torch.manual_seed(conf.seed)
    if conf.rm.checkpoint:
        path = Path(conf.rm.checkpoint)
        if not path.is_dir():
            raise ConfigError("rm.checkpoint", conf.rm.checkpoint, "the path of a local checkpoint folder")
        try:
            model = AutoModelForSequenceClassification.from_pretrained(str(path), num_labels=1, local_files_only=True)
        except (OSError, ValueError, KeyError) as ex:  # no config.json, no weights, an unknown model type
            reason = (str(ex).strip().splitlines() or [type(ex).__name__])[0]
            allowed = f"a local checkpoint folder of a transformers model (config.json and weights): {reason}"
            raise ConfigError("rm.checkpoint", conf.rm.checkpoint, allowed) from None
        desc = f"{path.name} ({type(model).__name__}, local checkpoint)"
        vocab = int(model.config.vocab_size)
    else:
        m = conf.rm.model
        cfg = LlamaConfig(vocab_size=m.vocab, hidden_size=m.d_model, intermediate_size=m.d_ff,
                          num_hidden_layers=m.layers, num_attention_heads=m.n_heads, num_key_value_heads=m.n_kv_heads,
                          max_position_embeddings=max(4096, max(conf.seq_lens)), num_labels=1, pad_token_id=0)
        model = LlamaForSequenceClassification(cfg)
        desc = (f"tiny-llama-rm (random init, seed {conf.seed}: layers={m.layers}, d_model={m.d_model}, "
                f"d_ff={m.d_ff}, heads={m.n_heads}/{m.n_kv_heads}, vocab={m.vocab})")
        vocab = m.vocab
    n = sum(p.numel() for p in model.parameters())
    model = model.to(device=device, dtype=dtype).eval()
    return model, f"{desc}, {n:,} parameters", vocab


def measure(conf: ProfileConf, log=None):
    """Run the grid; returns (header dict, rows of dicts)."""
    import torch
    import transformers

    if conf.threads:
        torch.set_num_threads(conf.threads)
    dev = conf.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(dev)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", conf.device, "cpu: CUDA is not available here")
    name = conf.dtype if conf.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    dtype = getattr(torch, name)
    model, desc, vocab = build_model(conf, dtype, device)
    cuda = device.type == "cuda"
    gen = torch.Generator().manual_seed(conf.seed)

    def forward(b: int, s: int) -> float:
        try:
            return timed(b, s)
        except RuntimeError as e:  # torch's allocation failure (CPU or CUDA: OutOfMemoryError is one)
            if not any(w in str(e).lower() for w in ("memory", "allocat")):
                raise
            raise ConfigError("batch_sizes", b, f"cells that fit in {dev}'s memory: batch {b} x seq {s} of this "
                                                f"model does not ({' '.join(str(e).split())[:160]}); smaller "
                                                f"batch_sizes= or seq_lens=, or a smaller model") from None

    def timed(b: int, s: int) -> float:
        ids = torch.randint(1, vocab, (b, s), generator=gen).to(device)
        mask = torch.ones_like(ids)
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model(input_ids=ids, attention_mask=mask).logits
        if cuda:
            torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        assert out.shape == (b, 1)
        return dt

    bs, ss = sorted(set(conf.batch_sizes)), sorted(set(conf.seq_lens))
    forward(bs[-1], ss[-1])  # first touch: allocator, kernels, caches
    rows = []
    for b in bs:
        for s in ss:
            for _ in range(conf.warmup):
                forward(b, s)
            times = [forward(b, s) for _ in range(conf.repeats)]
            rows.append({"batch_size": b, "seq_len": s, "seconds": min(times),
                         "seconds_median": statistics.median(times), "seconds_max": max(times),
                         "repeats": conf.repeats})
            if log:
                log(f"batch {b:>4} x seq {s:>5}: {rows[-1]['seconds'] * 1e3:9.3f} ms")
    if cuda:
        where = f"cuda ({torch.cuda.get_device_name(device)})"
    else:
        where = f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    header = {
        "racsim-profile": "forward passes of a sequence-classification reward model (seconds: fastest of repeats)",
        "model": desc,
        "checkpoint": conf.rm.checkpoint or "none (built in code)",
        "device": where,
        "dtype": name,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "repeats": f"{conf.repeats} timed after {conf.warmup} warm-up; seconds is the fastest (the least disturbed)",
    }
    return header, rows


SPREAD_NOTE = 0.25  # a cell whose slowest repeat is this much above its fastest is named as noisy
SLACK = 0.5  # and beyond that much more: cells of little work are all overhead, nearly equal
MORE_WORK = 4  # a larger cell is compared with a smaller one when it holds at least this many times its tokens


def check_rows(rows: List[dict]) -> Tuple[bool, str]:
    """(sound, one line) on what was measured. A profile is sound when the time grows with the batch
    and the length within the repeats' spread: no cell's fastest time exceeds the slowest time of a
    cell at least as large in both, with :data:`MORE_WORK` times its tokens (more work cannot be
    faster beyond the noise the repeats show).
    The line names the worst such pair, or the repeats' spread (median, and the worst cell's).
    (Past :data:`SLACK` too: cells of little work cost about the same, their order is noise on a busy
    machine.)"""
    worst, spread = None, []
    for r in rows:
        spread.append((r["seconds_max"] / r["seconds"] - 1 if r["seconds"] > 0 else 0.0, r))
        for big in rows:
            if (big is not r and big["batch_size"] >= r["batch_size"] and big["seq_len"] >= r["seq_len"]
                    and big["batch_size"] * big["seq_len"] >= MORE_WORK * r["batch_size"] * r["seq_len"]):
                gap = r["seconds"] / big["seconds_max"] if big["seconds_max"] > 0 else float("inf")
                if gap > 1 + SLACK and (worst is None or gap > worst[0]):
                    worst = (gap, r, big)
    cell = lambda r: f"batch {r['batch_size']} x seq {r['seq_len']}"  # noqa: E731
    ms = lambda t: f"{t * 1e3:.3g} ms"  # noqa: E731
    if worst is not None:
        gap, r, big = worst
        return False, (f"the times do not grow with the work, beyond the repeats' spread: {cell(r)} took at least "
                       f"{ms(r['seconds'])}, {cell(big)} at most {ms(big['seconds_max'])} (a busy machine? rerun with "
                       f"more repeats=, or threads=)")
    spread.sort(key=lambda x: x[0])
    median, (top, r) = spread[len(spread) // 2][0], spread[-1]
    noisy = f"; the noisiest, {cell(r)}, varied {top:.0%} (seconds is the fastest)" if top > SPREAD_NOTE else ""
    return True, f"times grow with batch and length; repeats within {median:.0%} of the fastest (median){noisy}"


def write_csv(path: Path, header: dict, rows: list) -> None:
    """The profile, written and recorded as racsim's (racsim.sweep.markers.publish): never over a file of
    the user's (FileExistsError), so that the next profile of that name may replace it."""
    lines = [f"# {k}: {v}" for k, v in header.items()]
    cols = ["batch_size", "seq_len", "seconds", "seconds_median", "seconds_max", "repeats"]
    lines.append(",".join(cols))
    for r in rows:
        lines.append(",".join(repr(r[c]) if isinstance(r[c], float) else str(r[c]) for c in cols))
    text = "\n".join(lines) + "\n"

    def write(stage: Path) -> List[Path]:
        write_text(stage / path.name, text)
        return [stage / path.name]

    publish(path.parent, write, track_edits=True)


@interruptible("racsim-profile", "interrupted; nothing written")  # the profile is written at the end, whole
def main(argv: Optional[List[str]] = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        say(help_text())
        return
    out = _profile(argv)
    say(f"racsim-profile: use it with rm.service=profiled rm.profile={out}")


def _profile(argv: List[str]) -> Path:
    """Parse, measure, write: the profile's path, or one error line and exit status 2."""
    try:
        conf = parse(argv)
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
        except ImportError as e:
            say(f"racsim-profile: error: {e.name} is not installed: pip install -e '.[rm]'", sys.stderr)
            sys.exit(2)
        header, rows = measure(conf, log=say)
    except ConfigError as ex:
        say(f"racsim-profile: error: {ex}", sys.stderr)
        sys.exit(2)
    sound, line = check_rows(rows)
    if not sound:  # a capacity run would take it as the GPU's cost: refused, nothing written
        say(f"racsim-profile: error: {line}; nothing written", sys.stderr)
        sys.exit(1)
    say(f"racsim-profile: check: {line}")
    out = Path(conf.out)
    try:
        write_csv(out, header, rows)
    except OSError as ex:  # FileExistsError: a file of the user's took the name while the profile ran
        why = str(ex) if isinstance(ex, FileExistsError) else write_failure(ex, "out=PATH") or f"cannot be written ({ex.strerror})"
        say(f"racsim-profile: error: out = {conf.out!r}: {why}", sys.stderr)
        sys.exit(2)
    say(f"racsim-profile: {len(rows)} cells on {header['device']} ({header['dtype']}) -> {out}")
    return out


if __name__ == "__main__":
    main()
