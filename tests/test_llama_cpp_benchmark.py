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
