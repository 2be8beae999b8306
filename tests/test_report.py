"""The main job's pipeline on a tiny model, and its HTML report as a person sees it (headless Chromium)."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import save_tiny, write_corpus
from reskip.cli import main
from reskip.research.report.options import ReportOptions
from reskip.research.report.page import report_run

pytestmark = pytest.mark.integration  # whole commands end to end

ARTIFACTS = Path(__file__).resolve().parent.parent / ".pytest_artifacts"


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pipe")
    model = save_tiny(tmp / "model", "llama")
    corpus = write_corpus(tmp / "corpus", n_docs=300)
    run = tmp / "run"
    args = ["run", "--out", str(run), "--preset", "quick", "--model", str(model), "--data", str(corpus),
            "--steps", "4", "--seq-len", "16", "--batch-size", "2", "--block-size", "2", "--rank", "8",
            "--delta", "100"]  # every routed block eligible, so the signal test has blocks to test
    assert main(args) == 0
    return run, args


def test_pipeline_writes_every_stage(pipeline_run):
    run, _ = pipeline_run
    state = json.loads((run / "pipeline.json").read_text())
    assert state["finished"] == ["parity", "train", "calibrate", "eval", "diagnose", "report"]
    peaks = [state["peak_rss_gib"][s] for s in state["finished"]]  # the high-water mark after each stage
    assert peaks[0] > 0.05 and peaks == sorted(peaks)
    for f in ("parity.json", "summary.json", "policy.json", "eval/results.json", "diagnostics.json", "report/report.html"):
        assert (run / f).is_file(), f
    d = json.loads((run / "diagnostics.json").read_text())
    assert len(d["dilution"]["cos2"]) == 7 and d["dilution"]["toy_model"][4] == pytest.approx(0.5)
    rows = {r["granularity"]: r for r in d["memory"]["this_model"][0]["rows"]}
    assert rows["every layer"]["states"] == 7 and rows["h_0 only"]["states"] == 1
    seed = {r["granularity"]: r for r in d["memory"]["source_instance"]["rows"]}
    assert seed["every layer"]["mib"] == pytest.approx(49 * 32) and seed["per block (this retrofit)"]["mib"] == pytest.approx(5 * 32)
    assert {r["block"] for r in d["routing_health"]} == {2, 3}
    assert len(d["sample_trace"]["steps"]) == len(d["sample_trace"]["tokens"])
    assert all("w_recent_range" in r for r in d["routing_health"]) and set(d["signal_health"]["blocks"]) == {"2", "3"}
    st = d["signal_test"]
    assert {(r["block"], r["p"]) for r in st["blocks"]} == {(n, p) for n in (2, 3) for p in (0.25, 0.5)}
    policy = json.loads((run / "policy.json").read_text())
    A = {b["block"]: b["A"] for b in policy["blocks"]}
    assert st["sequences"] == 4 and st["sentence"] and all(r["A"] == A[r["block"]] for r in st["blocks"])
    assert all("signal" in b for b in policy["blocks"] if b["block"] >= 2)


def test_resume_skips_finished_stages_and_refuses_reuse(pipeline_run, capsys):
    run, args = pipeline_run
    assert main(["run", "--resume", str(run)]) == 0
    assert capsys.readouterr().out.count("already finished") == 6
    assert main(args) == 2  # the folder already holds a run
    assert "already holds a run" in capsys.readouterr().err


def test_report_is_self_contained_and_captioned(pipeline_run):
    run, _ = pipeline_run
    page = (run / "report" / "report.html").read_text()
    assert not re.search(r"""(src|href)=['"]?https?://""", page)
    imgs = re.findall(r"<img [^>]*src='data:image/png;base64,", page)
    assert len(imgs) >= 8
    assert page.count("<figcaption>") == len(imgs)
    assert "Missing stages" not in page
    assert len(list((run / "report").glob("*.png"))) == len(imgs)


def test_report_of_a_partial_run_says_what_is_missing(pipeline_run, tmp_path):
    run, _ = pipeline_run
    shutil.copy(run / "parity.json", tmp_path / "parity.json")
    page = report_run(tmp_path).read_text()
    assert "Missing stages" in page and "reskip train" in page and "reskip calibrate" in page
    assert "Parity and parameters" in page


def _chromium():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("chromium is missing: the README's test command installs Debian's chromium package")
    return exe


def test_report_renders_in_headless_chromium(pipeline_run, tmp_path):
    run, _ = pipeline_run
    url = (run / "report" / "report.html").resolve().as_uri()
    base = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
            "--virtual-time-budget=5000"]
    dom = subprocess.run(base + ["--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body[^>]*>", dom.stdout).group(0)
    n_imgs = dom.stdout.count("<img ")
    assert 'data-status="rendered"' in body and f'data-figures="{n_imgs}/{n_imgs}"' in body, body
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not console, console
    shot = tmp_path / "report.png"
    res = subprocess.run(base + [f"--screenshot={shot}", "--window-size=1280,4000", url],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and shot.is_file() and shot.stat().st_size > 20_000, res.stderr[-2000:]
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(shot, ARTIFACTS / "report.png")


def test_the_report_of_the_committed_main_job_fits_1280_px(tmp_path):
    """The standard main job's own files (docs/results/main-standard, the widest tables the report shows) as a
    person opens them: at 1280 px nothing overflows sideways, no table or figure runs past the page."""
    from playwright.sync_api import sync_playwright

    page_file = report_run(Path(__file__).resolve().parent.parent / "docs" / "results" / "main-standard",
                           ReportOptions(out=str(tmp_path / "report")))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(page_file.resolve().as_uri())
        page.wait_for_function("document.body.getAttribute('data-status') !== null")
        width = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        wide = page.evaluate("Array.from(document.querySelectorAll('table, figure, img, p'))"
                             ".filter(e => e.getBoundingClientRect().right > document.documentElement.clientWidth)"
                             ".map(e => e.tagName + ' after ' + (e.previousElementSibling || {}).textContent)")
        browser.close()
    assert width[0] <= width[1] and not wide, (width, wide[:5])
