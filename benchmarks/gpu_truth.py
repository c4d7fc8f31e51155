"""Issue 54 on a GPU: the Tensor Core share mpwatch reads from its own trace against the HLO truth.

Acceptance item: "The self-captured trace's Tensor Core share is within 5 points of the HLO truth,
with at most 5% of device time of unknown precision".

What it does (Keras on the JAX backend; TensorFlow is never imported):

1. ``XLA_FLAGS`` gets ``--xla_dump_to=<workdir>/xla_dump --xla_dump_hlo_as_text`` (flags already
   there are kept) before JAX is imported, so XLA writes every compiled program's optimized HLO
   (``module_<id>.<name>.<...>after_optimizations.txt``; ``<id>`` is the ``program_id`` the trace's
   events carry).
2. A model is trained with ``mpwatch.MixedPrecisionMonitor(logdir, profile=True)`` (the profile
   window: batches 3-5) for ``--steps`` steps on synthetic data: keras.io's Transformer classifier
   of ``benchmarks/real_models.py`` (batch 64; default) or ``--model resnet50`` (64x64x3, 10
   classes, batch 32), under ``--policy`` (``mixed_bfloat16`` default, or ``mixed_float16``),
   Adam and sparse categorical crossentropy.
3. mpwatch's reading: ``mpwatch.load_run(logdir).profile_kernels`` (the profile record's
   ``kernel_summary``: ``tensor_core_share``, ``unknown_share``, ...) and its kernel table.
4. The truth, from the trace mpwatch captured and the XLA dump only: every GPU kernel event (an
   event of a ``/device:GPU`` plane with ``kernel_details``; memcpy/memset activities are no
   kernels, as in xprof's kernel table) is mapped to the HLO instruction it ran, with this
   script's own parser of the dump text (``mpwatch.profile.xplane`` decodes the raw events only;
   none of mpwatch's classification modules is used):

   - the event's ``hlo_module`` + ``program_id`` pick the dump file, its ``hlo_op`` the instruction;
   - inside a CUDA graph ``hlo_op`` is ``command_buffer_N``: a kernel named after a fusion
     (``loop_add_fusion_4``) is that fusion (``loop_add_fusion.4``); a library kernel (cuBLAS,
     cuDNN) is one of the library calls of the command buffer's computation where the dump has
     one, else of the calls that the schedule places between the fusions named before and after
     it in the same graph launch (widened until some are found, then the whole program); when
     those calls do not all read the same, the kernel is "ambiguous"; a copy kernel
     (``memcpy32_post``) is "other".

   An instruction is Tensor Core 16-bit work when it is a cuBLAS/cuBLASLt gemm custom call
   (``__cublas$gemm``, ``__cublas$lt$matmul``...), a cuDNN convolution or attention custom call
   (``__cudnn$conv...``, ``__cudnn$fmha...``), a bare ``dot``/``convolution``, or a custom fusion
   (``kind=kCustom``: Triton gemm, cuDNN fusion) whose computation holds a ``dot``/
   ``convolution``, with float16/bfloat16 operands; with float32 operands it is "float32 gemm"
   (XLA may run those as TF32 on Tensor Cores: reported apart); float8 operands "tc8"; a dot inside
   a loop/input fusion is "dot_other" (CUDA cores); everything else "other". A library call's
   helper kernels (padding, split-K reductions, layout transforms: :data:`HELPER`) are
   "tc16_helper": Tensor Core work by their instruction, not by what the kernel does.

   Truth Tensor Core share = (tc16 + tc8 + int8) time / all kernel time (helpers out; the share
   with helpers in is printed too); its unknown share = (ambiguous + unmapped) / all.
5. The verdict: PASS when |mpwatch's ``tensor_core_share`` - truth| <= 5 points and mpwatch's
   ``unknown_share`` <= 5%; also printed: the difference with helpers counted, and 16-bit Tensor
   Core time alone (mpwatch's ``tensor_core_by_precision_us`` float16 + bfloat16 against tc16:
   a TF32 kernel mpwatch counts is left out of both). The 10 longest kernels whose two readings
   disagree are listed. The same truth is also computed from the HLO in the trace's metadata plane
   (printed as text by jaxlib: the program mpwatch reads, parsed here): a cross-check, and the
   truth itself where the dump maps less than 95% of the kernel time (said so).

Every stage is wrapped: a failure prints its traceback and the script goes on with what it has.
On a CPU (``--cpu-smoke``, or no GPU) there are no GPU kernels: the pipeline runs end to end, says
"no GPU kernels", and checks that the dump maps the XLA CPU ops of the trace instead (on a CPU,
JAX 0.10 rejects ``mixed_float16``'s float16 dots with float32 accumulation: bfloat16 only).

    KERAS_BACKEND=jax python benchmarks/gpu_truth.py --json truth.json --save truth_files
    python benchmarks/gpu_truth.py --model resnet50 --policy mixed_float16
    KERAS_BACKEND=jax python benchmarks/gpu_truth.py --steps 12          # CPU smoke, ~15 s
    python benchmarks/gpu_truth.py --trace truth_files --hlo-dir truth_files/xla_dump  # offline
    python benchmarks/gpu_truth.py --trace tests/data/h100 --hlo-from-trace   # H100 fixture
    python benchmarks/gpu_truth.py --self-test      # the classifier on a synthetic HLO snippet

``--save DIR`` keeps the trace, the dump files of the programs it ran and the JSON, so the truth
can be recomputed offline (``--trace DIR --hlo-dir DIR/xla_dump``). mpwatch's reading of a GPU
trace needs xprof's converter (``tensorboard-plugin-profile``/``xprof``); without it the script
still prints the truth and says why mpwatch's reading is missing.
"""

import argparse
import glob
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

#: acceptance (issue 54)
MAX_DIFF_POINTS = 5.0
MAX_UNKNOWN_SHARE = 0.05
#: the dump must map this share of kernel time, else the trace's own HLO is used
MIN_MAPPED_SHARE = 0.95

MODELS = {"transformer": 64, "resnet50": 32}  # model -> default batch size

# --- HLO text -------------------------------------------------------------------------------------
_DTYPE = re.compile(r"([a-z][a-z0-9]*)\[")
_COMP_HEADER = re.compile(r"^(ENTRY\s+)?%?([^\s(%{]+)\s*(?:\(.*\))?.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([^\s=%]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"\s*([A-Za-z][\w\-]*)\(")
_CALLS = re.compile(
    r"\b(calls|to_apply|body|condition|branch_computations|called_computations)="
    r"(\{[^}]*\}|%?[\w.\-]+)"
)
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_FUSION_KIND = re.compile(r"\bkind=(k\w+)")
_BACKEND_KIND = re.compile(r'"fusion_backend_config":\{"kind":"([^"]+)"')
_NON_WORD = re.compile(r"[^A-Za-z0-9_]")

GEMM_TARGET = re.compile(r"^__cublas\$(?:gemm|lt\$matmul)|gemm|matmul", re.I)
CONV_TARGET = re.compile(r"^__cudnn\$conv", re.I)
ATTENTION_TARGET = re.compile(r"^__cudnn\$(?:fmha|flash|sdpa)|fmha|flash_?attention", re.I)
#: helper kernels of a library call (no matrix math of their own)
HELPER = re.compile(
    r"memset|memcpy|AddPadding|ReduceSplitK|splitKreduce|split_?k_?reduce|reduce_?split_?k|"
    r"nchwToNhwc|nhwcToNchw|tensorTransform|TransformGeneric|TransformKernel|scalePackedTensor|"
    r"computeOffsetsKernel|redzone",
    re.I,
)
#: copy kernels XLA launches itself inside a CUDA graph
COPY_KERNEL = re.compile(r"^(?:memcpy|memset)", re.I)
SIXTEEN = frozenset({"f16", "bf16"})

#: truth categories; the first three count as Tensor Core work
TC_CATEGORIES = ("tc16", "tc8", "tc_int8")
CATEGORIES = (
    *TC_CATEGORIES,
    "tc16_helper",
    "f32_gemm",
    "dot_other",
    "other",
    "ambiguous",
    "unmapped",
)


def sanitized(name: str) -> str:
    """A kernel name as XLA makes it from an instruction's (``loop_add_fusion.4`` ->
    ``loop_add_fusion_4``)."""
    return _NON_WORD.sub("_", name)


def _balanced(text: str, start: int) -> int:
    """The index just past the bracket closing the one at ``text[start]`` (or len(text))."""
    depth = 0
    pairs = {"(": ")", "[": "]", "{": "}"}
    closers = set(pairs.values())
    i = start
    while i < len(text):
        c = text[i]
        if c == '"':
            j = text.find('"', i + 1)
            i = len(text) if j < 0 else j + 1
            continue
        if c in pairs:
            depth += 1
        elif c in closers:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return len(text)


def _split_top(text: str) -> list[str]:
    """``text`` split at commas outside brackets."""
    out, depth, cur = [], 0, []
    for c in text:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def first_dtype(type_text: str) -> str:
    """The element type of an HLO shape (a tuple's first element's): ``f16[2,3]{1,0}`` -> f16."""
    m = _DTYPE.search(type_text)
    return m.group(1) if m else ""


@dataclass
class Instr:
    name: str
    opcode: str
    dtype: str
    operands: list[str]
    operand_types: list[str]  # the dtype written beside an operand (older text format), or ""
    attrs: str
    computation: str
    index: int  # position in its computation (the schedule order of a scheduled module)
    target: str = ""
    calls: list[str] = field(default_factory=list)
    fusion_kind: str = ""
    backend_kind: str = ""


@dataclass
class Computation:
    name: str
    instrs: list[Instr] = field(default_factory=list)
    entry: bool = False


@dataclass
class Module:
    name: str
    module_id: int | None
    path: str
    computations: dict[str, Computation] = field(default_factory=dict)
    by_name: dict[str, Instr] = field(default_factory=dict)
    by_kernel: dict[str, list[Instr]] = field(default_factory=dict)
    _readings: dict[str, "Reading"] = field(default_factory=dict)

    def dtype_of(self, instr: Instr, i: int) -> str:
        """The dtype of operand ``i`` of ``instr`` (from its computation's instructions)."""
        if i >= len(instr.operands):
            return ""
        other = self.by_name.get(instr.operands[i])
        if other is not None:
            return other.dtype
        return instr.operand_types[i] if i < len(instr.operand_types) else ""


def _parse_instr(line: str, comp: str, index: int) -> Instr | None:
    m = _INSTR.match(line)
    if not m:
        return None
    name, rest = m.group(2), m.group(3)
    if rest.startswith("("):
        end = _balanced(rest, 0)
        type_text, after = rest[:end], rest[end:]
    else:
        parts = rest.split(None, 1)
        if len(parts) < 2:
            return None
        type_text, after = parts
        after = " " + after
    om = _OPCODE.match(after)
    if not om:
        return None
    opcode = om.group(1)
    open_at = om.end() - 1
    close = _balanced(after, open_at)
    operand_text = after[open_at + 1 : close - 1]
    attrs = after[close:]
    operands, operand_types = [], []
    for piece in _split_top(operand_text):
        tokens = piece.split()
        operands.append(tokens[-1].lstrip("%") if tokens else "")
        operand_types.append(first_dtype(piece) if len(tokens) > 1 else "")
    calls: list[str] = []
    for cm in _CALLS.finditer(attrs):
        value = cm.group(2)
        calls.extend(v.strip().lstrip("%") for v in value.strip("{}").split(",") if v.strip())
    tm = _TARGET.search(attrs)
    fk = _FUSION_KIND.search(attrs)
    bk = _BACKEND_KIND.search(attrs)
    return Instr(
        name=name,
        opcode=opcode,
        dtype=first_dtype(type_text),
        operands=operands,
        operand_types=operand_types,
        attrs=attrs,
        computation=comp,
        index=index,
        target=tm.group(1) if tm else "",
        calls=calls,
        fusion_kind=fk.group(1) if fk and opcode == "fusion" else "",
        backend_kind=bk.group(1) if bk else "",
    )


def parse_hlo_text(text: str, path: str = "", module_id: int | None = None) -> Module:
    """An HLO module's text (XLA's dump, either text format: with or without ``%``) -> Module."""
    mod = Module(name="", module_id=module_id, path=path)
    comp: Computation | None = None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("//"):
            continue
        if line.startswith("HloModule"):
            head = line[len("HloModule") :].strip()
            mod.name = re.split(r"[\s,]", head, maxsplit=1)[0]
            continue
        if not line[0].isspace():
            if line.startswith("}"):
                comp = None
                continue
            hm = _COMP_HEADER.match(line)
            if hm:
                comp = Computation(name=hm.group(2), entry=bool(hm.group(1)))
                mod.computations[comp.name] = comp
            continue
        if comp is None:
            continue
        ins = _parse_instr(line, comp.name, len(comp.instrs))
        if ins is None:
            continue
        comp.instrs.append(ins)
        mod.by_name[ins.name] = ins
        mod.by_kernel.setdefault(sanitized(ins.name), []).append(ins)
    return mod


# --- the truth's reading of an instruction ------------------------------------------------------
@dataclass
class Reading:
    category: str  # one of CATEGORIES
    precision: str  # "16", "f32", "f8", "int8", "f64", "mixed", ""
    why: str


def precision_of(dtypes: Iterable[str]) -> str:
    """The precision of matrix math from its operand dtypes."""
    s = {d for d in dtypes if d}
    if not s:
        return ""
    if s <= SIXTEEN:
        return "16"
    if any(d.startswith(("f8", "f4")) for d in s) and all(
        d.startswith(("f8", "f4")) or d in SIXTEEN for d in s
    ):
        return "f8"
    if s == {"f32"}:
        return "f32"
    if s == {"f64"}:
        return "f64"
    if s <= {"s8", "u8", "s4", "u4"}:
        return "int8"
    return "mixed"


def _category(precision: str) -> str:
    return {"16": "tc16", "f8": "tc8", "int8": "tc_int8", "f32": "f32_gemm"}.get(
        precision, "dot_other"
    )


def _matmuls_inside(mod: Module, comp_names: list[str], seen: set[str]) -> list[Instr]:
    """dot/convolution/gemm custom calls in these computations and those they call."""
    out: list[Instr] = []
    for cname in comp_names:
        if cname in seen:
            continue
        seen.add(cname)
        comp = mod.computations.get(cname)
        if comp is None:
            continue
        for ins in comp.instrs:
            if ins.opcode in ("dot", "convolution") or (
                ins.opcode == "custom-call" and _library_kind(ins.target) != ""
            ):
                out.append(ins)
            if ins.calls:
                out.extend(_matmuls_inside(mod, ins.calls, seen))
    return out


def _library_kind(target: str) -> str:
    """``gemm``, ``conv`` or ``attention`` for a custom call target of matrix math, else ``""``."""
    if ATTENTION_TARGET.search(target):
        return "attention"
    if CONV_TARGET.search(target):
        return "conv"
    if GEMM_TARGET.search(target):
        return "gemm"
    return ""


def read_instr(mod: Module, ins: Instr) -> Reading:
    """What an instruction's kernels are, by its HLO alone."""
    got = mod._readings.get(ins.name)
    if got is not None:
        return got
    if ins.opcode == "custom-call":
        kind = _library_kind(ins.target)
        if kind:
            p = precision_of([mod.dtype_of(ins, 0), mod.dtype_of(ins, 1)])
            r = Reading(_category(p), p, f"{ins.target} ({kind})")
        else:
            r = Reading("other", "", f"custom call {ins.target}")
    elif ins.opcode in ("dot", "convolution"):
        p = precision_of([mod.dtype_of(ins, 0), mod.dtype_of(ins, 1)])
        r = Reading(_category(p), p, f"bare {ins.opcode}")
    elif ins.opcode == "fusion":
        inside = _matmuls_inside(mod, ins.calls, set())
        if inside:
            dtypes = [mod.dtype_of(m, i) for m in inside for i in (0, 1)]
            p = precision_of(dtypes)
            what = ",".join(sorted({m.opcode if m.opcode != "custom-call" else m.target
                                    for m in inside}))  # fmt: skip
            if ins.fusion_kind == "kCustom":
                r = Reading(_category(p), p, f"kCustom fusion {ins.backend_kind} with {what}")
            else:
                r = Reading("dot_other", p, f"{ins.fusion_kind} fusion with {what} (CUDA cores)")
        else:
            r = Reading("other", "", f"{ins.fusion_kind or 'fusion'} without matrix math")
    else:
        r = Reading("other", "", ins.opcode)
    mod._readings[ins.name] = r
    return r


def launches_library_kernels(mod: Module, ins: Instr, run_kernels: set[str]) -> bool:
    """Whether an instruction's kernels carry a library's names (not its own): custom calls, and
    custom fusions with matrix math that no kernel of the graph launch is named after."""
    if ins.opcode == "custom-call":
        return True
    if ins.opcode == "fusion" and ins.fusion_kind == "kCustom":
        return sanitized(ins.name) not in run_kernels and bool(
            _matmuls_inside(mod, ins.calls, set())
        )
    return False


# --- programs: the dump, or the trace's metadata ----------------------------------------------
_DUMP_FILE = re.compile(r"^module_(\d+)\.(.+?)\.(?:[^/]*_)?after_optimizations\.txt$")


class Programs:
    """Compiled programs by ``(name, program_id)``, parsed lazily."""

    source = ""

    def __init__(self) -> None:
        self.files: list[tuple[int | None, str, Any]] = []  # (id, name, loader)
        self._parsed: dict[int, Module | None] = {}
        self.errors: list[str] = []

    def _module(self, i: int) -> Module | None:
        if i not in self._parsed:
            try:
                self._parsed[i] = self.files[i][2]()
            except Exception as e:  # noqa: BLE001 - one unreadable program: left out
                self.errors.append(f"{self.files[i][1]}: {e!r}")
                self._parsed[i] = None
        return self._parsed[i]

    def lookup(self, name: str, program_id: Any, hlo_op: str = "") -> tuple[Module | None, str]:
        """The program an event ran and how it was found (``id``, ``name``, ``name+op``)."""
        try:
            pid = int(program_id) if program_id not in (None, "") else None
        except (TypeError, ValueError):
            pid = None
        same = [i for i, (fid, fname, _) in enumerate(self.files) if fname == name]
        exact = [i for i in same if pid is not None and self.files[i][0] == pid]
        if exact:
            return self._module(exact[0]), "id"
        if len(same) == 1:
            return self._module(same[0]), "name"
        for i in sorted(same, key=lambda i: -(self.files[i][0] or 0)):
            mod = self._module(i)
            if mod is not None and hlo_op and hlo_op in mod.by_name:
                return mod, "name+op"
        return None, "no program" if not same else "several programs, none with the op"


class DumpPrograms(Programs):
    source = "xla_dump"

    def __init__(self, dump_dir: str) -> None:
        super().__init__()
        self.dir = dump_dir
        best: dict[tuple[int, str], str] = {}
        for path in sorted(
            glob.glob(os.path.join(glob.escape(dump_dir), "*after_optimizations.txt"))
        ):
            m = _DUMP_FILE.match(os.path.basename(path))
            if not m:
                continue
            key = (int(m.group(1)), m.group(2))
            # several after_optimizations files of one module: the GPU one (last pass) wins
            if key not in best or "gpu_after" in os.path.basename(path):
                best[key] = path
        for (mid, name), path in sorted(best.items()):
            self.files.append((mid, name, lambda p=path, i=mid: self._load(p, i)))
        self.paths = {(mid, name): path for (mid, name), path in best.items()}

    @staticmethod
    def _load(path: str, mid: int) -> Module:
        with open(path, encoding="utf-8", errors="replace") as f:
            return parse_hlo_text(f.read(), path, mid)


def _hlo_module_bytes(hlo_proto: bytes) -> bytes:
    """Field 1 (``hlo_module``) of a serialized ``xla.HloProto``."""

    def varint(b: bytes, i: int) -> tuple[int, int]:
        r = shift = 0
        while True:
            x = b[i]
            i += 1
            r |= (x & 0x7F) << shift
            shift += 7
            if x < 0x80:
                return r, i

    i = 0
    while i < len(hlo_proto):
        key, i = varint(hlo_proto, i)
        fnum, wire = key >> 3, key & 7
        if wire == 2:
            n, i = varint(hlo_proto, i)
            if fnum == 1:
                return bytes(hlo_proto[i : i + n])
            i += n
        elif wire == 0:
            _, i = varint(hlo_proto, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            break
    raise ValueError("no hlo_module in the HloProto")


class TracePrograms(Programs):
    """The programs of the trace's ``/host:metadata`` plane, printed as text by jaxlib."""

    source = "trace_hlo"

    def __init__(self, spaces: list[Any]) -> None:
        super().__init__()
        pid_re = re.compile(r"^(.*)\((\d+)\)$")
        for space in spaces:
            meta = space.plane("/host:metadata")
            if meta is None:
                continue
            for key, stats in meta.metadata_stats.items():
                blob = stats.get("Hlo Proto")
                if not isinstance(blob, bytes) or not blob:
                    continue
                m = pid_re.match(key)
                name, pid = (m.group(1), int(m.group(2))) if m else (key, None)
                self.files.append((pid, name, lambda b=blob, k=key, p=pid: self._load(b, k, p)))

    @staticmethod
    def _load(blob: bytes, key: str, pid: int | None) -> Module:
        from jax._src.lib import xla_client

        text = xla_client.XlaComputation(_hlo_module_bytes(blob)).as_hlo_text()
        return parse_hlo_text(text, f"trace:{key}", pid)


# --- the trace's GPU kernels ----------------------------------------------------------------------
@dataclass
class Kernel:
    name: str
    us: float
    module: str
    program_id: Any
    hlo_op: str
    correlation: Any
    line: str
    offset_ps: int


def gpu_kernels(spaces: list[Any]) -> tuple[list[Kernel], dict[str, float]]:
    """The GPU kernel events of decoded traces, and the other device activities' time by name
    (memcpy/memset: no kernels)."""
    kernels: list[Kernel] = []
    others: dict[str, float] = defaultdict(float)
    for space in spaces:
        for plane in space.device_planes:
            if not plane.name.startswith("/device:GPU"):
                continue
            for line in plane.lines:
                for ev in line.events:
                    if "kernel_details" not in ev.stats:
                        others[ev.name] += ev.duration_ps / 1e6
                        continue
                    kernels.append(
                        Kernel(
                            name=ev.name,
                            us=ev.duration_ps / 1e6,
                            module=str(ev.stats.get("hlo_module") or ""),
                            program_id=ev.stats.get("program_id"),
                            hlo_op=str(ev.stats.get("hlo_op") or ""),
                            correlation=ev.stats.get("correlation_id"),
                            line=f"{plane.name}/{line.name}",
                            offset_ps=line.timestamp_ns * 1000 + ev.offset_ps,
                        )
                    )
    return kernels, dict(others)


@dataclass
class Row:
    kernel: Kernel
    category: str
    how: str  # hlo_op, kernel_name, cb_computation, cb_window, cb_module, cb_copy, unmapped...
    instr: str = ""
    why: str = ""
    program: str = ""


def _with_helper(kernel: Kernel, r: Reading) -> str:
    if r.category in TC_CATEGORIES and HELPER.search(kernel.name):
        return "tc16_helper" if r.category == "tc16" else "other"
    return r.category


def classify_kernels(kernels: list[Kernel], programs: Programs) -> list[Row]:
    """Every kernel's truth (:class:`Row`)."""
    rows: list[Row] = []
    runs: dict[tuple, list[Kernel]] = defaultdict(list)
    found: dict[tuple, Module] = {}
    for k in kernels:
        if not k.module:
            rows.append(Row(k, "unmapped", "unmapped: no hlo_module"))
            continue
        mod, how_found = programs.lookup(k.module, k.program_id, k.hlo_op)
        if mod is None:
            rows.append(Row(k, "unmapped", f"unmapped: {how_found}"))
            continue
        prog = f"{mod.name}({mod.module_id})"
        ins = mod.by_name.get(k.hlo_op)
        if ins is not None:
            r = read_instr(mod, ins)
            rows.append(Row(k, _with_helper(k, r), "hlo_op", ins.name, r.why, prog))
            continue
        key = (prog, k.hlo_op, k.correlation, k.line)
        runs[key].append(k)
        found[key] = mod
    for key, run in runs.items():
        got = _classify_run(found[key], key[0], key[1], sorted(run, key=lambda k: k.offset_ps))
        if not key[1].startswith("command_buffer"):
            # an hlo_op that is no command buffer and not in the program: said in ``how``
            for r in got:
                r.how = f"op_missing:{r.how}"
        rows.extend(got)
    return rows


def _classify_run(mod: Module, prog: str, hlo_op: str, run: list[Kernel]) -> list[Row]:
    """The kernels of one launch of a command buffer (a CUDA graph), in the order they ran."""
    out: list[Row] = []
    names = {sanitized(k.name) for k in run}
    named: list[tuple[int, Instr]] = []
    for i, k in enumerate(run):
        cands = mod.by_kernel.get(sanitized(k.name), [])
        if cands:
            named.append((i, cands[0]))
    named_at = dict(named)
    # a command buffer computation of its own in the dump (older XLA: an HLO pass made them)
    own = next(
        (c for c in mod.computations.values() if sanitized(c.name) == sanitized(hlo_op)), None
    )
    for i, k in enumerate(run):
        if i in named_at:
            ins = named_at[i]
            r = read_instr(mod, ins)
            out.append(Row(k, _with_helper(k, r), "kernel_name", ins.name, r.why, prog))
            continue
        if COPY_KERNEL.search(k.name):
            out.append(Row(k, "other", "cb_copy", "", "a copy kernel of the graph", prog))
            continue
        cands, how = _library_candidates(mod, run, i, named, names, own)
        if not cands:
            out.append(Row(k, "unmapped", "unmapped: no library call found", "", "", prog))
            continue
        readings = {c.name: read_instr(mod, c) for c in cands}
        cats = {_with_helper(k, r) for r in readings.values()}
        label = ",".join(sorted(readings))[:200]
        if len(cats) == 1:
            r = next(iter(readings.values()))
            out.append(Row(k, cats.pop(), how, label, r.why, prog))
        else:
            why = "; ".join(sorted({f"{n}: {r.category}" for n, r in readings.items()}))[:300]
            out.append(Row(k, "ambiguous", how, label, why, prog))
    return out


def _library_candidates(
    mod: Module,
    run: list[Kernel],
    i: int,
    named: list[tuple[int, Instr]],
    names: set[str],
    own: Computation | None,
) -> tuple[list[Instr], str]:
    """The library calls a kernel without a name of XLA's may have run, and how they were found."""
    if own is not None:
        cands = [ins for ins in _all_inside(mod, own) if launches_library_kernels(mod, ins, names)]
        if cands:
            return cands, "cb_computation"
    before = [ins for j, ins in named if j < i][::-1]
    after = [ins for j, ins in named if j > i]
    for widen in range(max(len(before), len(after)) + 1):
        lo = before[widen] if widen < len(before) else None
        hi = after[widen] if widen < len(after) else None
        if lo is None and hi is None:
            break
        comp_name = (lo or hi).computation
        comp = mod.computations[comp_name]
        a = lo.index if lo is not None and lo.computation == comp_name else -1
        b = hi.index if hi is not None and hi.computation == comp_name else len(comp.instrs)
        if a > b:  # out of the schedule's order (a reused kernel, concurrent nodes): wider
            continue
        cands = [ins for ins in comp.instrs[a + 1 : b] if launches_library_kernels(mod, ins, names)]
        if cands:
            return cands, "cb_window" if widen == 0 else f"cb_window+{widen}"
    cands = [
        ins
        for comp in mod.computations.values()
        for ins in comp.instrs
        if launches_library_kernels(mod, ins, names) and _called_from_code(mod, comp)
    ]
    return cands, "cb_module"


def _all_inside(mod: Module, comp: Computation) -> list[Instr]:
    out: list[Instr] = []
    for ins in comp.instrs:
        out.append(ins)
        if ins.opcode in ("call", "while", "conditional"):
            for c in ins.calls:
                if c in mod.computations:
                    out.extend(_all_inside(mod, mod.computations[c]))
    return out


def _called_from_code(mod: Module, comp: Computation) -> bool:
    """Whether a computation runs kernels of its own (the entry, a loop body, a branch...), not
    one fused into a fusion or applied by a reduce."""
    fused = getattr(mod, "_fused", None)
    if fused is None:
        fused = set()
        for c in mod.computations.values():
            for ins in c.instrs:
                if ins.opcode not in ("call", "while", "conditional"):
                    fused.update(ins.calls)
        mod._fused = fused  # type: ignore[attr-defined]
    return comp.name not in fused


# --- the truth's figures -----------------------------------------------------------------------
def _share(part: float, total: float) -> float:
    return part / total if total > 0 else float("nan")


def truth_summary(rows: list[Row], source: str) -> dict[str, Any]:
    total = sum(r.kernel.us for r in rows)
    by_cat = {c: 0.0 for c in CATEGORIES}
    by_how: dict[str, float] = defaultdict(float)
    for r in rows:
        by_cat[r.category] += r.kernel.us
        by_how[r.how] += r.kernel.us
    tc = sum(by_cat[c] for c in TC_CATEGORIES)
    unknown = by_cat["ambiguous"] + by_cat["unmapped"]
    unmapped = [r for r in rows if r.category in ("unmapped", "ambiguous")]
    worst: dict[tuple[str, str], float] = defaultdict(float)
    for r in unmapped:
        worst[(r.kernel.name[:100], r.how + (f" [{r.why[:120]}]" if r.why else ""))] += r.kernel.us
    return {
        "source": source,
        "total_us": total,
        "kernels": len(rows),
        "by_category_us": by_cat,
        "by_category_share": {c: _share(v, total) for c, v in by_cat.items()},
        "mapped_by_us": dict(by_how),
        "tensor_core_share": _share(tc, total),
        "tensor_core_share_helpers_in": _share(tc + by_cat["tc16_helper"], total),
        "tc16_share": _share(by_cat["tc16"], total),
        "f32_gemm_share": _share(by_cat["f32_gemm"], total),
        "unknown_share": _share(unknown, total),
        "mapped_share": _share(total - by_cat["unmapped"], total),
        "unknown_kernels": [
            {"kernel": k, "how": h, "us": v}
            for (k, h), v in sorted(worst.items(), key=lambda kv: -kv[1])[:10]
        ],
    }


def truth_per_kernel(rows: list[Row]) -> dict[str, dict[str, Any]]:
    """Kernel name -> time, Tensor Core time and time by category (with its instructions)."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        d = out.setdefault(
            r.kernel.name,
            {
                "us": 0.0,
                "tc_us": 0.0,
                "by_category": defaultdict(float),
                "instrs": set(),
                "how": set(),
            },
        )
        d["us"] += r.kernel.us
        if r.category in TC_CATEGORIES:
            d["tc_us"] += r.kernel.us
        d["by_category"][r.category] += r.kernel.us
        if r.instr:
            d["instrs"].add(r.instr[:80])
        d["how"].add(r.how)
    return out


# --- CPU: the dump against the XLA CPU ops of the trace -----------------------------------------
def cpu_mapping(spaces: list[Any], programs: Programs) -> dict[str, Any]:
    """How much XLA CPU op time (host events with ``hlo_module``/``hlo_op``) the dump maps."""
    total = mapped = 0.0
    missing: dict[str, float] = defaultdict(float)
    events = 0
    for space in spaces:
        plane = space.plane("/host:CPU")
        if plane is None:
            continue
        for line in plane.lines:
            for ev in line.events:
                op, module = ev.stats.get("hlo_op"), ev.stats.get("hlo_module")
                if not op or not module:
                    continue
                events += 1
                us = ev.duration_ps / 1e6
                total += us
                mod, _ = programs.lookup(str(module), ev.stats.get("program_id"), str(op))
                if mod is not None and str(op) in mod.by_name:
                    mapped += us
                else:
                    missing[f"{module}({ev.stats.get('program_id')})/{op}"] += us
    return {
        "xla_cpu_events": events,
        "xla_cpu_us": total,
        "mapped_share": _share(mapped, total),
        "unmapped": dict(sorted(missing.items(), key=lambda kv: -kv[1])[:10]),
    }


# --- mpwatch's reading and the comparison -------------------------------------------------------
def mpwatch_reading(logdir: str) -> dict[str, Any]:
    import mpwatch

    run = mpwatch.load_run(logdir)
    out: dict[str, Any] = {"profile_source": run.profile_source}
    prof = run.profile or {}
    for key in ("kernel_note", "kernels_dropped", "tool", "bits_rule", "steps"):
        if key in prof:
            out[key] = prof[key]
    notices = [n for n in (run.notices or []) if "profile" in json.dumps(n, default=str)]
    if notices:
        out["notices"] = notices[:5]
    warnings = [str(w) for w in (run.warnings or []) if re.search(r"profil|trace", str(w))]
    if warnings:
        out["warnings"] = warnings[:5]
    kernels = run.profile_kernels
    out["summary"] = kernels
    table = run.profile_kernel_table
    per: dict[str, dict[str, Any]] = {}
    if len(table):
        for rec in table.to_dict("records"):
            d = per.setdefault(
                str(rec.get("kernel_name")),
                {"us": 0.0, "tc_us": 0.0, "unknown_us": 0.0, "readings": set()},
            )
            us = float(rec.get("total_duration_us") or 0.0)
            d["us"] += us
            if rec.get("tensor_core") == "yes":
                d["tc_us"] += us
            if rec.get("precision") == "unknown":
                d["unknown_us"] += us
            d["readings"].add(
                f"{rec.get('precision')}/tc={rec.get('tensor_core')} hlo_op={rec.get('hlo_op')} "
                f"({rec.get('tensor_core_why') or rec.get('evidence') or ''})"[:200]
            )
    out["per_kernel"] = per
    return out


def compare(truth: dict[str, Any], mp: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"truth_tensor_core_share": truth["tensor_core_share"]}
    s = (mp or {}).get("summary") or {}
    if not s:
        out["verdict"] = "NO READING"
        out["why"] = "mpwatch's profile record has no kernel summary"
        return out
    mp_tc, mp_unknown = (
        float(s.get("tensor_core_share", math.nan)),
        float(s.get("unknown_share", math.nan)),
    )
    tc_by_p = s.get("tensor_core_by_precision_us") or {}
    mp_total = float(s.get("total_us") or 0.0)
    mp_tc16 = _share(sum(float(tc_by_p.get(p) or 0.0) for p in ("float16", "bfloat16")), mp_total)
    diff = 100 * (mp_tc - truth["tensor_core_share"])
    diff_16 = 100 * (mp_tc16 - truth["tc16_share"])
    diff_helpers = 100 * (mp_tc - truth["tensor_core_share_helpers_in"])
    out.update(
        mpwatch_tensor_core_share=mp_tc,
        mpwatch_tensor_core_16bit_share=mp_tc16,
        mpwatch_unknown_share=mp_unknown,
        mpwatch_tensor_core_unknown_share=s.get("tensor_core_unknown_share"),
        mpwatch_share_16bit=s.get("share_16bit"),
        mpwatch_total_us=mp_total,
        truth_total_us=truth["total_us"],
        total_ratio=_share(mp_total, truth["total_us"]),
        diff_points=diff,
        diff_points_helpers_in=diff_helpers,
        diff_points_16bit=diff_16,
        within_5_points=abs(diff) <= MAX_DIFF_POINTS,
        within_5_points_helpers_in=abs(diff_helpers) <= MAX_DIFF_POINTS,
        unknown_ok=mp_unknown <= MAX_UNKNOWN_SHARE,
        truth_reliable=truth["unknown_share"] <= MAX_UNKNOWN_SHARE,
    )
    out["verdict"] = "PASS" if out["within_5_points"] and out["unknown_ok"] else "FAIL"
    return out


def disagreements(
    truth_k: dict[str, dict[str, Any]], mp_k: dict[str, dict[str, Any]], top: int = 10
) -> list[dict[str, Any]]:
    """The longest kernels the two readings disagree on (Tensor Core time, or knowing it)."""
    rows = []
    for name in set(truth_k) | set(mp_k):
        t, m = truth_k.get(name), mp_k.get(name)
        us = max(t["us"] if t else 0.0, m["us"] if m else 0.0)
        t_tc = t["tc_us"] if t else 0.0
        m_tc = m["tc_us"] if m else 0.0
        t_unknown = (
            (t["by_category"].get("ambiguous", 0) + t["by_category"].get("unmapped", 0)) if t else 0
        )
        m_unknown = m["unknown_us"] if m else 0.0
        differs = abs(t_tc - m_tc) > 0.02 * us + 0.5 or m_unknown > 0.5 or t_unknown > 0.5
        if t is None or m is None:
            differs = us > 0.5
        if not differs:
            continue
        rows.append(
            {
                "kernel": name[:120],
                "us": us,
                "truth_us": t["us"] if t else None,
                "truth_tc_us": t_tc,
                "truth": (
                    ", ".join(f"{c} {v:.1f}us" for c, v in sorted(t["by_category"].items()))
                    + f" via {'/'.join(sorted(t['how']))}: {'; '.join(sorted(t['instrs']))[:160]}"
                )
                if t
                else "(not in the trace's kernel events)",
                "mpwatch_us": m["us"] if m else None,
                "mpwatch_tc_us": m_tc,
                "mpwatch": "; ".join(sorted(m["readings"]))[:300]
                if m
                else "(not in mpwatch's table)",
            }
        )
    rows.sort(key=lambda r: -r["us"])
    return rows[:top]


# --- training -------------------------------------------------------------------------------------
def _load_real_models() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "mpwatch_bench_real_models", os.path.join(HERE, "real_models.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train(args: argparse.Namespace, logdir: str, result: dict[str, Any]) -> Any:
    import random

    import keras
    import numpy as np

    import mpwatch

    rm = _load_real_models()
    keras.mixed_precision.set_global_policy(args.policy)
    # not keras.utils.set_random_seed: it imports TensorFlow where it is installed
    random.seed(0)
    np.random.seed(0)
    if args.model == "resnet50":
        model = keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3), classes=10)
    else:
        model = rm.transformer()
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
    x, y = rm.make_data(args.model, args.batch_size)
    monitor = mpwatch.MixedPrecisionMonitor(logdir, profile=True, probe=not args.no_probe)
    t0 = time.perf_counter()
    model.fit(
        rm.batches(x, y, args.batch_size),
        steps_per_epoch=args.steps,
        epochs=1,
        verbose=0,
        callbacks=[monitor],
        shuffle=False,
    )
    result["fit_s"] = time.perf_counter() - t0
    from mpwatch.record.callbacks.profile_capture import ProfileMonitor

    prof = next((p for p in monitor.parts if isinstance(p, ProfileMonitor)), None)
    if prof is not None:
        result["profile_error"] = prof.error
        result["profile_trace_dir"] = prof.trace_dir
        result["profile_deferred"] = getattr(prof, "deferred", None)
    return model


# --- report ---------------------------------------------------------------------------------------
def _pct(v: Any) -> str:
    try:
        v = float(v)
    except (TypeError, ValueError):
        return "n/a"
    return "n/a" if math.isnan(v) else f"{100 * v:.1f}%"


def _last_error(tb: str) -> str:
    """The exception line of a formatted traceback."""
    lines = [ln for ln in tb.strip().splitlines() if ln.strip()]
    found = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b", ln)]
    return (found or lines or [""])[-1][:500]


def no_reading_why(result: dict[str, Any]) -> str:
    """Why mpwatch's record has no kernel figures, as far as the run says."""
    mp = result.get("mpwatch") or {}
    why = [
        *(
            [_last_error(result["errors"]["mpwatch"])]
            if "mpwatch" in result.get("errors", {})
            else []
        ),
        *(
            [f"the profile failed: {result['profile_error']}"]
            if result.get("profile_error")
            else []
        ),
        *([mp["kernel_note"]] if mp.get("kernel_note") else []),
        *(mp.get("warnings") or []),
        *[str(n.get("message", n))[:300] for n in mp.get("notices") or []],
    ]
    return "; ".join(why) or f"profile source {mp.get('profile_source')}"


def report(result: dict[str, Any]) -> None:
    print(
        "\n=== gpu_truth: issue 54, Tensor Core share of mpwatch's own trace vs the HLO truth ==="
    )
    env, args = result.get("env", {}), result.get("args", {})
    if args.get("trace"):
        print(f"offline: trace {result.get('trace')}")
    else:
        print(
            f"device: {env.get('device', '?')}  jax {env.get('jax', '?')}"
            f"  keras {env.get('keras', '?')}  model {args.get('model')}"
            f"  policy {args.get('policy')}  steps {args.get('steps')}"
        )
    truth = result.get("truth")
    if result.get("no_gpu_kernels"):
        print("no GPU kernels in the trace (CPU run): the pipeline ran end to end")
        cpu = result.get("cpu_mapping") or {}
        if cpu:
            print(
                f"  the dump maps {_pct(cpu.get('mapped_share'))} of"
                f" {cpu.get('xla_cpu_us', 0):.0f} us of XLA CPU ops ({cpu.get('xla_cpu_events')}"
                " events)"
            )
    if truth:
        bc = truth["by_category_share"]
        print(
            f"truth ({truth['source']}): {truth['kernels']} kernel events,"
            f" {truth['total_us']:.0f} us; Tensor Core {_pct(truth['tensor_core_share'])}"
            f" (helpers in: {_pct(truth['tensor_core_share_helpers_in'])});"
            f" unknown {_pct(truth['unknown_share'])}"
            f" (ambiguous {_pct(bc['ambiguous'])}, unmapped {_pct(bc['unmapped'])});"
            f" float32 gemm {_pct(bc['f32_gemm'])} (TF32 possible)"
        )
        print("  by category: " + ", ".join(f"{c} {_pct(v)}" for c, v in bc.items() if v))
        print(
            "  mapped by: "
            + ", ".join(
                f"{h} {_pct(v / truth['total_us'])}" for h, v in truth["mapped_by_us"].items()
            )
        )
        for u in truth["unknown_kernels"][:5]:
            print(f"  unknown: {u['us']:.1f} us {u['kernel'][:70]} ({u['how'][:120]})")
    other = result.get("truth_other")
    if other:
        print(
            f"truth ({other['source']}, for comparison): Tensor Core"
            f" {_pct(other['tensor_core_share'])}, unknown {_pct(other['unknown_share'])}"
        )
    mp = result.get("mpwatch") or {}
    s = mp.get("summary")
    if s:
        print(
            f"mpwatch: Tensor Core {_pct(s.get('tensor_core_share'))}, unknown precision"
            f" {_pct(s.get('unknown_share'))}, Tensor Core unknown"
            f" {_pct(s.get('tensor_core_unknown_share'))}, 16-bit {_pct(s.get('share_16bit'))},"
            f" xprof's flag {_pct(s.get('xprof_tensor_core_share'))}, {s.get('total_us', 0):.0f} us"
        )
    elif result.get("no_gpu_kernels"):
        print(f"mpwatch: profile source {mp.get('profile_source')} (no kernel figures on a CPU)")
    elif "mpwatch_error" in result or mp:
        print(f"mpwatch: no kernel reading ({no_reading_why(result)})")
    if mp.get("kernels_dropped"):
        print(f"  (mpwatch's record left out its {mp['kernels_dropped']} shortest kernels)")
    c = result.get("compare")
    if c and "diff_points" in c:
        print(
            f"difference: {c['diff_points']:+.1f} points"
            f" (helpers in: {c['diff_points_helpers_in']:+.1f};"
            f" 16-bit only: {c['diff_points_16bit']:+.1f});"
            f" totals mpwatch/truth {c['total_ratio']:.3f};"
            f" mpwatch 16-bit Tensor Core {_pct(c['mpwatch_tensor_core_16bit_share'])}"
        )
        if not c["truth_reliable"]:
            print("  (the truth itself leaves more than 5% unknown: read the verdict with care)")
    if c and "diff_points" in c:
        dis = result.get("disagreements") or []
        print(f"kernels the readings disagree on, longest first: {len(dis) or 'none'}")
    for d in result.get("disagreements") or []:
        print(f"  {d['us']:9.1f} us  {d['kernel'][:90]}")
        print(f"      truth:   tc {d['truth_tc_us']:.1f} us; {d['truth'][:200]}")
        print(f"      mpwatch: tc {d['mpwatch_tc_us']:.1f} us; {d['mpwatch'][:200]}")
    if c and c.get("verdict") == "NO READING":
        print(f"VERDICT: NO READING (mpwatch: {c.get('why')})")
    elif c:
        print(
            f"VERDICT: {c.get('verdict')} (|diff| <= {MAX_DIFF_POINTS:.0f} points:"
            f" {c.get('within_5_points')}; mpwatch unknown <= 5%: {c.get('unknown_ok')})"
        )
    for name, err in (result.get("errors") or {}).items():
        print(f"stage {name} failed: {_last_error(err)}")
    times = result.get("stage_s") or {}
    print(
        "stages: "
        + ", ".join(f"{k} {v:.1f}s" for k, v in times.items())
        + f"; total {result.get('total_s', 0):.1f}s (after the interpreter's start)"
    )
    print(f"tensorflow imported: {result.get('tensorflow_imported')}")


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        items = sorted(obj, key=str) if isinstance(obj, set) else obj
        return [_jsonable(v) for v in items]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if hasattr(obj, "item"):
        try:
            return _jsonable(obj.item())
        except Exception:  # noqa: BLE001
            pass
    return str(obj)


# --- self-test ------------------------------------------------------------------------------------
SELF_TEST_HLO = """\
HloModule jit_train_step, is_scheduled=true

gemm_fusion_dot_computation {
  parameter_0 = bf16[64,32]{1,0} parameter(0)
  parameter_1 = bf16[32,32]{1,0} parameter(1)
  ROOT dot.1 = bf16[64,32]{1,0} dot(parameter_0, parameter_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

gemm_fusion_f32_computation {
  p0 = f32[64,20]{1,0} parameter(0)
  p1 = f32[20,2]{1,0} parameter(1)
  ROOT dot.2 = f32[64,2]{1,0} dot(p0, p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

fused_add {
  a = bf16[64,32]{1,0} parameter(0)
  b = bf16[64,32]{1,0} parameter(1)
  ROOT add.3 = bf16[64,32]{1,0} add(a, b)
}

ENTRY main.9 {
  x = bf16[64,32]{1,0} parameter(0)
  w = bf16[32,32]{1,0} parameter(1)
  h = f32[64,20]{1,0} parameter(2)
  k = f32[20,2]{1,0} parameter(3)
  gemm_fusion_dot = bf16[64,32]{1,0} fusion(x, w), kind=kCustom, calls=gemm_fusion_dot_computation, backend_config={"fusion_backend_config":{"kind":"__triton_nested_gemm_fusion"}}
  loop_add_fusion.4 = bf16[64,32]{1,0} fusion(gemm_fusion_dot, x), kind=kLoop, calls=fused_add
  custom-call.5 = (bf16[64,32]{1,0}, s8[4194304]{0}) custom-call(loop_add_fusion.4, w), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{}}
  get-tuple-element.6 = bf16[64,32]{1,0} get-tuple-element(custom-call.5), index=0
  loop_add_fusion.7 = bf16[64,32]{1,0} fusion(get-tuple-element.6, x), kind=kLoop, calls=fused_add
  custom-call.8 = (f32[64,2]{1,0}, s8[4194304]{0}) custom-call(h, k), custom_call_target="__cublas$lt$matmul"
  gemm_fusion_f32 = f32[64,2]{1,0} fusion(h, k), kind=kCustom, calls=gemm_fusion_f32_computation
  %cudnn-conv.1 = (f16[8,8,8,4]{3,2,1,0}, u8[0]{0}) custom-call(f16[8,8,8,4]{3,2,1,0} %x, f16[3,3,4,4]{3,2,1,0} %w), window={size=3x3}, custom_call_target="__cudnn$convForward"
  ROOT tuple.9 = (bf16[64,32]{1,0}, f32[64,2]{1,0}) tuple(loop_add_fusion.7, gemm_fusion_f32)
}
"""  # noqa: E501


def self_test() -> None:
    """The classifier on :data:`SELF_TEST_HLO` and a made-up command buffer launch."""
    mod = parse_hlo_text(SELF_TEST_HLO, "self-test", 7)
    want = {
        "gemm_fusion_dot": "tc16",
        "loop_add_fusion.4": "other",
        "custom-call.5": "tc16",
        "custom-call.8": "f32_gemm",
        "gemm_fusion_f32": "f32_gemm",
        "cudnn-conv.1": "tc16",
        "get-tuple-element.6": "other",
    }
    for name, cat in want.items():
        got = read_instr(mod, mod.by_name[name])
        assert got.category == cat, (name, got)

    class One(Programs):
        def __init__(self) -> None:
            super().__init__()
            self.files = [(7, "jit_train_step", lambda: mod)]

    def k(name: str, op: str, t: int, us: float = 1.0, corr: str = "9") -> Kernel:
        return Kernel(name, us, "jit_train_step", "7", op, corr, "GPU:0/Stream #1", t)

    kernels = [
        k("cudnn_something_fprop", "cudnn-conv.1", 0, 5.0),
        k("nhwcAddPaddingKernel<half>", "cudnn-conv.1", 1, 0.5),
        k("gemm_fusion_dot", "command_buffer_1", 2),
        k("loop_add_fusion_4", "command_buffer_1", 3),
        k("nvjet_hsh_64x32_TNT", "command_buffer_1", 4, 3.0),  # custom-call.5, between .4 and .7
        k("loop_add_fusion_7", "command_buffer_1", 5),
        k("memcpy32_post", "command_buffer_1", 6),
        k("cutlass_80_tensorop_s1688gemm", "command_buffer_1", 7, 2.0),  # custom-call.8
        k("gemm_fusion_f32", "command_buffer_1", 8),
        k("whatever", "nothing.1", 9),
        Kernel("lost", 1.0, "jit_other", "3", "x", "1", "GPU:0/Stream #1", 10),
    ]
    rows = {r.kernel.name: r for r in classify_kernels(kernels, One())}
    expect = {
        "cudnn_something_fprop": ("tc16", "hlo_op"),
        "nhwcAddPaddingKernel<half>": ("tc16_helper", "hlo_op"),
        "gemm_fusion_dot": ("tc16", "kernel_name"),
        "loop_add_fusion_4": ("other", "kernel_name"),
        "nvjet_hsh_64x32_TNT": ("tc16", "cb_window"),
        "memcpy32_post": ("other", "cb_copy"),
        "cutlass_80_tensorop_s1688gemm": ("f32_gemm", "cb_window"),
        "gemm_fusion_f32": ("f32_gemm", "kernel_name"),
    }
    for name, (cat, how) in expect.items():
        r = rows[name]
        assert (r.category, r.how) == (cat, how), (name, r.category, r.how, r.instr)
    assert rows["lost"].category == "unmapped"
    assert rows["whatever"].category in ("tc16", "ambiguous", "f32_gemm", "other")
    summary = truth_summary(list(rows.values()), "self-test")
    assert summary["by_category_us"]["tc16"] == 5.0 + 1.0 + 3.0, summary
    print("self-test passed")


# --- main -----------------------------------------------------------------------------------------
def _find_trace(path: str) -> str:
    if os.path.isfile(path):
        return path
    here = sorted(glob.glob(os.path.join(glob.escape(path), "*.xplane.pb")))
    if here:
        return here[-1]
    runs = sorted(
        glob.glob(os.path.join(glob.escape(path), "plugins", "profile", "*", "*.xplane.pb"))
    )
    if runs:
        return max(runs, key=os.path.getmtime)
    raise FileNotFoundError(f"no *.xplane.pb under {path}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--model", choices=sorted(MODELS), default="transformer")
    p.add_argument(
        "--policy", choices=["mixed_bfloat16", "mixed_float16"], default="mixed_bfloat16"
    )
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--no-probe", action="store_true", help="switch mpwatch's probe off")
    p.add_argument("--cpu-smoke", action="store_true", help="run on the CPU (JAX_PLATFORMS=cpu)")
    p.add_argument("--workdir", help="where the logdir and the dump go (default: a new temp dir)")
    p.add_argument("--json", help="write the result as JSON here")
    p.add_argument("--save", help="copy the trace, the dump files it needs and the JSON here")
    p.add_argument("--trace", help="offline: a trace (.xplane.pb, run dir or logdir); no training")
    p.add_argument("--hlo-dir", help="offline: the XLA dump directory of that trace")
    p.add_argument(
        "--hlo-from-trace",
        action="store_true",
        help="the truth from the HLO of the trace's metadata plane (jaxlib prints it as text)",
    )
    p.add_argument("--self-test", action="store_true")
    args = p.parse_args(argv)
    if args.batch_size is None:
        args.batch_size = MODELS[args.model]
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    start = time.perf_counter()
    args = parse_args(argv)
    import importlib.util

    if importlib.util.find_spec("mpwatch") is None:  # run from a checkout, not installed
        sys.path.insert(0, os.path.dirname(HERE))
    if args.self_test:
        self_test()
        return {}
    result: dict[str, Any] = {"args": vars(args), "errors": {}, "stage_s": {}}
    state: dict[str, Any] = {}

    def stage(name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        print(f"[gpu_truth] {name}...", file=sys.stderr, flush=True)
        try:
            return fn()
        except BaseException as e:  # noqa: BLE001 - report what we got, go on
            if isinstance(e, KeyboardInterrupt):
                raise
            tb = traceback.format_exc()
            print(f"[gpu_truth] stage {name} failed:\n{tb}", file=sys.stderr, flush=True)
            result["errors"][name] = tb
            return None
        finally:
            result["stage_s"][name] = time.perf_counter() - t0

    offline = args.trace is not None
    workdir = args.workdir or tempfile.mkdtemp(prefix="gpu_truth-")
    os.makedirs(workdir, exist_ok=True)
    logdir = os.path.join(workdir, "logdir")
    dump_dir = args.hlo_dir or os.path.join(workdir, "xla_dump")
    result["workdir"] = workdir

    def setup() -> None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        if offline:
            return
        os.environ["KERAS_BACKEND"] = "jax"
        # a program loaded from JAX's persistent cache is not compiled, so not dumped
        os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"
        if args.cpu_smoke:
            os.environ["JAX_PLATFORMS"] = "cpu"
        flags = os.environ.get("XLA_FLAGS", "")
        extra = f"--xla_dump_to={dump_dir} --xla_dump_hlo_as_text"
        os.environ["XLA_FLAGS"] = f"{flags} {extra}".strip()
        result["xla_flags"] = os.environ["XLA_FLAGS"]
        import jax
        import keras

        dev = jax.devices()[0]
        result["env"] = {
            "jax": jax.__version__,
            "keras": keras.__version__,
            "backend": keras.backend.backend(),
            "platform": dev.platform,
            "device": getattr(dev, "device_kind", str(dev)),
        }
        state["gpu"] = dev.platform == "gpu"
        if not state["gpu"]:
            print("[gpu_truth] no GPU: CPU smoke run", file=sys.stderr)

    stage("setup", setup)
    if not offline:
        stage("train", lambda: train(args, logdir, result))

    def find() -> str:
        trace = _find_trace(args.trace if offline else logdir)
        result["trace"] = trace
        result["trace_bytes"] = os.path.getsize(trace)
        return trace

    trace = stage("find_trace", find)

    def read_mpwatch() -> None:
        src = logdir
        if offline:
            # mpwatch reads a logdir: the trace's own, or a copy of the trace in a fresh one
            up = os.path.dirname(os.path.dirname(os.path.dirname(trace)))
            if os.path.basename(os.path.dirname(os.path.dirname(trace))) == "profile" and glob.glob(
                os.path.join(glob.escape(up), "events.out.tfevents.*")
            ):
                src = up
            else:
                src = os.path.join(workdir, "offline_logdir")
                dst = os.path.join(src, "plugins", "profile", "run", os.path.basename(trace))
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copyfile(trace, dst)
        mp = mpwatch_reading(src)
        state["mp"] = mp
        result["mpwatch"] = {k: v for k, v in mp.items() if k != "per_kernel"}

    if trace:
        stage("mpwatch", read_mpwatch)

    def decode() -> None:
        from mpwatch.profile import xplane

        spaces = [xplane.read_xspace(trace)]
        state["spaces"] = spaces
        kernels, others = gpu_kernels(spaces)
        state["kernels"] = kernels
        result["gpu_kernel_events"] = len(kernels)
        result["device_non_kernel_us"] = dict(sorted(others.items(), key=lambda kv: -kv[1])[:10])

    if trace:
        stage("decode_trace", decode)

    def truth_from(programs: Programs) -> tuple[dict[str, Any], list[Row]]:
        rows = classify_kernels(state["kernels"], programs)
        summary = truth_summary(rows, programs.source)
        if programs.errors:
            summary["program_errors"] = programs.errors[:5]
        return summary, rows

    def truth() -> None:
        kernels = state.get("kernels")
        if kernels is None:
            return
        use_dump = not args.hlo_from_trace and os.path.isdir(dump_dir)
        dump = DumpPrograms(dump_dir) if use_dump else None
        if dump is not None:
            result["dump_modules"] = len(dump.files)
            state["dump"] = dump
        if not kernels:
            result["no_gpu_kernels"] = True
            if dump is not None:
                result["cpu_mapping"] = cpu_mapping(state["spaces"], dump)
            return
        primary = truth_from(dump) if dump is not None else None
        try:  # the same truth from the trace's own HLO: a cross-check, or the fallback
            other = truth_from(TracePrograms(state["spaces"]))
        except Exception:  # noqa: BLE001
            result["errors"]["truth_trace_hlo"] = traceback.format_exc()
            other = None
        if other is not None and (primary is None or primary[0]["mapped_share"] < MIN_MAPPED_SHARE):
            if primary is not None:
                print(
                    "[gpu_truth] the dump maps only "
                    f"{_pct(primary[0]['mapped_share'])} of kernel time: the truth comes from "
                    "the trace's HLO",
                    file=sys.stderr,
                )
            primary, other = other, primary
        if other is not None:
            result["truth_other"] = other[0]
        if primary is None:
            raise RuntimeError(f"no HLO for the truth: no dump at {dump_dir} and none in the trace")
        result["truth"], state["rows"] = primary

    if trace:
        stage("truth", truth)

    def comparison() -> None:
        if "truth" not in result:
            return
        mp = state.get("mp")
        result["compare"] = compare(result["truth"], mp)
        if result["compare"]["verdict"] == "NO READING":
            result["compare"]["why"] = no_reading_why(result)
            return
        result["disagreements"] = disagreements(
            truth_per_kernel(state["rows"]), (mp or {}).get("per_kernel") or {}
        )

    stage("compare", comparison)

    def save() -> None:
        if not args.save or not trace:
            return
        os.makedirs(args.save, exist_ok=True)
        shutil.copyfile(trace, os.path.join(args.save, os.path.basename(trace)))
        dump = state.get("dump")
        if dump is not None:
            ran = {(k.module, str(k.program_id)) for k in state.get("kernels") or []}
            out = os.path.join(args.save, "xla_dump")
            os.makedirs(out, exist_ok=True)
            for (mid, name), path in dump.paths.items():
                if (name, str(mid)) in ran or not ran:
                    shutil.copyfile(path, os.path.join(out, os.path.basename(path)))

    stage("save", save)
    result["tensorflow_imported"] = "tensorflow" in sys.modules
    result["total_s"] = time.perf_counter() - start
    stage("report", lambda: report(result))
    text = json.dumps(_jsonable(result), indent=1)
    for path in (args.json, os.path.join(args.save, "gpu_truth.json") if args.save else None):
        if path:
            try:
                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
                with open(path, "w") as f:
                    f.write(text)
                print(f"[gpu_truth] wrote {path}", file=sys.stderr)
            except OSError as e:
                print(f"[gpu_truth] could not write {path}: {e}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
