"""benchmarks/llama_cpp_export.py without llama.cpp: what it reads from llama.cpp's output."""


def test_the_llama_cpp_benchmark_reads_llama_perplexity_s_summary():
    """benchmarks/llama_cpp_export.py's reading of llama.cpp's KL summary (its own text, as llama-perplexity
    prints it), so a format change there fails here rather than as a silent null in the results."""
    import importlib.util as iu
    from pathlib import Path

    spec = iu.spec_from_file_location("llama_cpp_export", Path(__file__).resolve().parents[1] / "benchmarks" /
                                      "llama_cpp_export.py")
    bench = iu.module_from_spec(spec)
    spec.loader.exec_module(bench)
    log = ("Mean PPL(Q)                   :  17.204885 ±   3.673205\nMean PPL(base)                :  15.911807 ±   "
           "3.673185\n====== KL divergence statistics ======\nMean    KLD:   0.412345 ±   0.000001\nMaximum KLD:   "
           "4.000052\nSame top p: 71.250 ± 0.500 %\n")
    assert bench.parse_kl_log(log) == {"mean_kld": 0.412345, "same_top_p": 0.7125, "ppl_compressed": 17.204885,
                                       "ppl_original": 15.911807}


def _bench_module():
    import importlib.util as iu
    from pathlib import Path

    spec = iu.spec_from_file_location("llama_cpp_export", Path(__file__).resolve().parents[1] / "benchmarks" /
                                      "llama_cpp_export.py")
    bench = iu.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_llama_cpp_benchmark_refuses_in_one_line_and_never_reuses_another_models_gguf(tmp_path):
    """Its arguments checked before any work, a converter's failure one line with the converter's own last words,
    and a GGUF converted earlier read back only for the same model (named by the folder's digest)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "llama_cpp_export.py"
    compressed = tmp_path / "model"
    compressed.mkdir()
    (compressed / "config.json").write_text("{}")
    (compressed / "reskip.json").write_text("{}")
    (compressed / "model.safetensors").write_bytes(b"one")

    def run(*args):
        return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True,
                              timeout=120)

    missing = run("--llama-cpp", tmp_path / "nowhere", "--compressed", compressed)
    assert missing.returncode == 2 and "no llama.cpp checkout there" in missing.stderr and "Traceback" not in missing.stderr
    llama = tmp_path / "llama.cpp"
    (llama / "build" / "bin").mkdir(parents=True)
    (llama / "convert_hf_to_gguf.py").write_text("import sys\nprint('KeyError: tokenizer.ggml.model', file=sys.stderr)"
                                                 "\nsys.exit(1)\n")
    unbuilt = run("--llama-cpp", llama, "--compressed", compressed)
    assert unbuilt.returncode == 2 and "llama-bench, llama-perplexity not built" in unbuilt.stderr
    for tool in ("llama-bench", "llama-perplexity"):
        (llama / "build" / "bin" / tool).write_text("")
    notexport = run("--llama-cpp", llama, "--compressed", tmp_path)
    assert notexport.returncode == 2 and "not a folder `reskip compress`" in notexport.stderr
    broken = run("--llama-cpp", llama, "--compressed", compressed, "--original", compressed, "--work", tmp_path / "w")
    assert broken.returncode == 2 and "Traceback" not in broken.stderr
    assert "converter on" in broken.stderr and "KeyError: tokenizer.ggml.model" in broken.stderr
    bench = _bench_module()
    first = bench.folder_digest(compressed)
    (compressed / "model.safetensors").write_bytes(b"two")  # another model exported under the same name
    assert bench.folder_digest(compressed) != first


def test_the_lm_eval_and_iterative_benchmarks_refuse_before_any_work(tmp_path):
    """lm_eval_export checks --compressed and --limit before scoring the original for minutes; iterative_removal's
    refusals are one line, not tracebacks."""
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    cases = [(["lm_eval_export.py", "--compressed", str(tmp_path)], "not a model folder"),
             (["lm_eval_export.py", "--compressed", str(tmp_path), "--limit", "0"], "not a model folder"),
             (["iterative_removal.py", "--out", str(tmp_path / "o"), "--drop", "0"], "take 1 or more"),
             (["iterative_removal.py", "--out", str(tmp_path / "o"), "--preset", "huge"], "--preset huge: one of")]
    for argv, message in cases:
        done = subprocess.run([sys.executable, str(bench / argv[0]), *argv[1:]], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
