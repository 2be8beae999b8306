"""The exported model in llama.cpp, beside the original: both plain Hugging Face folders converted to GGUF by
llama.cpp's own `convert_hf_to_gguf.py` (the same type for both), then

- speed: `llama-bench` (prompt processing of 512 tokens, generation of 64), original and compressed interleaved,
  the median of the rounds, and the ratio;
- fidelity inside llama.cpp: `llama-perplexity --kl-divergence` on held-out text (kjv's test split by default): the
  original's logits saved once (`--kl-divergence-base`), the compressed model's mean KL to them and the share of
  positions with the same top token, as llama.cpp computes them, beside each model's perplexity.

llama.cpp is not a dependency of reskip: point --llama-cpp at a checkout built with its tools, e.g. the one vendored
in the `llama-cpp-python` source archive:

    pip install sentencepiece     # the converter imports it
    pip download llama-cpp-python --no-deps --no-binary :all: && tar xzf llama_cpp_python-*.tar.gz
    cd llama_cpp_python-*/vendor/llama.cpp && cmake -B build -DLLAMA_CURL=OFF && \\
        cmake --build build --target llama-bench llama-perplexity llama-quantize -j 2
    python benchmarks/llama_cpp_export.py --llama-cpp PATH/TO/llama.cpp --compressed smollm2-26/model \\
        --out docs/results/compress/llama-cpp.json

(`-j 2`, not a bare `-j`: a bare `-j` started 47 compilers at once on a 2-core, 24 GB machine and ran it out of
memory; `llama-quantize` makes the `--quantize` figures.) The guide has the whole recipe (docs/guide.md, "In
llama.cpp"). Prints one JSON line and writes it to --out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from reskip.machine_load import load_average, load_report, spread


def fail(message: str) -> None:
    print(f"llama_cpp_export: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def folder_digest(folder: Path) -> str:
    """What a converted GGUF was made from: the sha256 of the folder's config and weights (a second model exported
    into the same folder name is converted anew, never read back as the first)."""
    digest = hashlib.sha256()
    for f in sorted([folder / "config.json", *folder.glob("*.safetensors")]):
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def run_tool(argv: list, what: str, **kwargs) -> subprocess.CompletedProcess:
    """A llama.cpp tool, its failure one line with the tool's own last words (never a traceback around them)."""
    try:
        return subprocess.run([str(a) for a in argv], check=True, capture_output=True, text=True, **kwargs)
    except subprocess.CalledProcessError as e:
        last = [line for line in (e.stderr or e.stdout or "").strip().splitlines() if line.strip()][-3:]
        fail(f"{what} failed (exit {e.returncode}): {' / '.join(last) or 'no output'}")


def convert(llama_cpp: Path, folder: Path, out: Path, outtype: str) -> Path:
    """A plain Hugging Face folder -> one GGUF file, by llama.cpp's converter (its own gguf-py on the path); named
    by the folder's digest, so a file converted earlier is read back only for the same model."""
    out = out.with_name(f"{out.stem}-{folder_digest(folder)}{out.suffix}")
    if out.is_file():
        return out
    env = {**os.environ, "PYTHONPATH": str(llama_cpp / "gguf-py") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    tmp = out.with_name(f".{out.name}.tmp")
    run_tool([sys.executable, llama_cpp / "convert_hf_to_gguf.py", folder, "--outtype", outtype, "--outfile", tmp],
             f"llama.cpp's converter on {folder}", env=env)
    tmp.replace(out)
    return out


def check_arguments(a) -> None:
    """Every input before any work: the llama.cpp checkout and its built tools, the compressed folder."""
    llama_cpp = Path(a.llama_cpp)
    if not (llama_cpp / "convert_hf_to_gguf.py").is_file():
        fail(f"--llama-cpp {llama_cpp}: no llama.cpp checkout there (convert_hf_to_gguf.py is missing); the module's "
             "help says how to get and build one")
    tools = ["llama-bench", "llama-perplexity"] + (["llama-quantize"] if a.quantize else [])
    missing = [t for t in tools if not (llama_cpp / "build" / "bin" / t).is_file()]
    if missing:
        fail(f"--llama-cpp {llama_cpp}: {', '.join(missing)} not built (cmake --build build --target {' '.join(tools)} "
             "-j 2)")
    compressed = Path(a.compressed)
    if not (compressed / "config.json").is_file() or not (compressed / "reskip.json").is_file():
        fail(f"--compressed {compressed}: not a folder `reskip compress` (its model/) or `reskip export` wrote")
    if a.rounds < 1 or a.chunks < 1 or a.ctx < 8 or a.threads < 1:
        fail("--rounds, --chunks and --threads take 1 or more, --ctx 8 or more")


def quantize(tool: Path, gguf: Path, kind: str) -> Path:
    """llama-quantize's `kind` (e.g. Q4_1, the bundled original's type) of a converted GGUF file."""
    out = gguf.with_name(gguf.stem + f"-{kind.lower()}.gguf")
    if not out.is_file():
        run_tool([tool, gguf, out, kind], f"llama-quantize {kind}")
    return out


def bench(tool: Path, model: Path, threads: int, prompt: int, gen: int) -> dict:
    """llama-bench's tokens per second for a prompt of `prompt` tokens and a generation of `gen`."""
    proc = run_tool([tool, "-m", model, "-p", prompt, "-n", gen, "-t", threads, "-r", 3, "-o", "json"], "llama-bench")
    rows = json.loads(proc.stdout)
    out = {}
    for r in rows:
        key = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
        out[key] = r["avg_ts"]
    return out


def kl_divergence(tool: Path, original: Path, compressed: Path, text: Path, base: Path, ctx: int, chunks: int,
                  threads: int) -> dict:
    """llama-perplexity's KL of the compressed model to the original's saved logits, on `chunks` windows of `ctx`."""
    common = ["-f", str(text), "-c", str(ctx), "-b", str(ctx), "--chunks", str(chunks), "-t", str(threads)]
    first = run_tool([tool, "-m", original, *common, "--kl-divergence-base", base], "llama-perplexity (original)")
    second = run_tool([tool, "-m", compressed, "--kl-divergence-base", base, "--kl-divergence", *common],
                      "llama-perplexity (compressed)")
    out = parse_kl_log(second.stdout + second.stderr)
    out["ppl_original_run"] = _final_ppl(first.stdout + first.stderr)
    return out


def parse_kl_log(log: str) -> dict:
    """llama-perplexity --kl-divergence's summary: mean KL, the share of positions with the same top token, and each
    model's perplexity (llama.cpp scores the second half of every window)."""
    found = {name: re.search(pattern, log) for name, pattern in (
        ("mean_kld", r"Mean\s+KLD:\s+([-0-9.e]+)"), ("same_top_p", r"Same top p:\s+([-0-9.e]+)"),
        ("ppl_compressed", r"Mean PPL\(Q\)\s+:\s+([-0-9.e]+)"), ("ppl_original", r"Mean PPL\(base\)\s+:\s+([-0-9.e]+)"))}
    out = {k: float(m.group(1)) if m else None for k, m in found.items()}
    if out["same_top_p"] is not None:
        out["same_top_p"] /= 100  # llama.cpp prints a percentage
    return out


def _final_ppl(log: str) -> float | None:
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", log)
    return float(m.group(1)) if m else None


def heldout_text(path: Path, source: str, documents: int) -> Path:
    from reskip.data.sources import load_splits

    docs = load_splits([source])[0]["test"][:documents]
    path.write_text("\n\n".join(d.text for d in docs))
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-cpp", required=True, help="a llama.cpp checkout with build/bin/llama-bench and "
                                                      "llama-perplexity built")
    p.add_argument("--compressed", required=True, help="the folder `reskip compress` or `reskip export` wrote")
    p.add_argument("--original", default=None, help="the original as a plain folder (default: the bundled "
                                                    "SmolLM2-135M-Instruct's converted copy)")
    p.add_argument("--outtype", default="bf16", choices=("f32", "f16", "bf16", "q8_0"), help="GGUF type of both")
    p.add_argument("--quantize", default=None, help="then quantize both with llama-quantize to this type (e.g. Q4_1, "
                                                    "the bundled original's own)")
    p.add_argument("--original-gguf", default=None, help="the original as a GGUF file as shipped (e.g. the bundled "
                                                         "Q4_1 file), instead of converting --original")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2, help="interleaved llama-bench rounds per model")
    p.add_argument("--heldout", default="kjv", help="the held-out text of the KL check")
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--chunks", type=int, default=16)
    p.add_argument("--work", default="runs/llama-cpp", help="where the GGUF files and the logits go")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    check_arguments(a)
    load_before = load_average()
    from reskip.backbones.loading import resolve

    llama_cpp, work = Path(a.llama_cpp), Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    original = Path(a.original) if a.original else Path(resolve(None)[1])
    t0 = time.perf_counter()
    tools = llama_cpp / "build" / "bin"
    ggufs = {name: convert(llama_cpp, folder, work / f"{name}-{a.outtype}.gguf", a.outtype)
             for name, folder in (("original", original), ("compressed", Path(a.compressed)))}
    if a.quantize:
        ggufs = {n: quantize(tools / "llama-quantize", g, a.quantize) for n, g in ggufs.items()}
    if a.original_gguf:
        ggufs["original"] = Path(a.original_gguf)
    rounds = {name: [] for name in ggufs}
    for _ in range(a.rounds):  # interleaved: the machine's drift falls on both
        for name, gguf in ggufs.items():
            rounds[name].append(bench(tools / "llama-bench", gguf, a.threads, 512, 64))
    speed = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in rounds.items()}
    text = heldout_text(work / f"{a.heldout}-test.txt", a.heldout, 200)
    kld = kl_divergence(tools / "llama-perplexity", ggufs["original"], ggufs["compressed"], text,
                        work / f"{ggufs['original'].stem}.kld", a.ctx, a.chunks, a.threads)
    result = {"benchmark": "llama_cpp_export", "outtype": a.outtype, "quantize": a.quantize,
              "original_gguf": a.original_gguf, "threads": a.threads, "rounds": a.rounds,
              "original": str(original), "compressed": a.compressed,
              "gguf_bytes": {n: g.stat().st_size for n, g in ggufs.items()}, "tokens_per_s": speed,
              "speedup": {k: speed["compressed"][k] / speed["original"][k] for k in speed["original"]},
              "speedup_rounds": {k: spread([c[k] / o[k] for o, c in zip(rounds["original"], rounds["compressed"])])
                                 for k in speed["original"]},
              "heldout": a.heldout, "ctx": a.ctx, "chunks": a.chunks, "kl": kld, "wall_s": time.perf_counter() - t0}
    result["load"] = load_report(load_before, load_average(), a.threads)
    if result["load"]["note"]:
        print(f"note: {result['load']['note']}", file=sys.stderr)
    line = json.dumps(result)
    print(line)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
