"""`reskip lab`: the one-variable rule, the measured delta on a tiny trained and calibrated run, the server's
answers to bad requests, and the page in a real headless browser (the system chromium driven by
Playwright; nothing downloads a browser)."""

import json
import shutil
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers import tiny_trained_run

ARTIFACTS = Path(__file__).resolve().parents[1] / ".pytest_artifacts"


@pytest.fixture(scope="module")
def lab_run(tmp_path_factory):
    return tiny_trained_run(tmp_path_factory.mktemp("lab"), ["--budgets", "0.5,1", "--chunk-size", "4"])


@pytest.fixture(scope="module")
def session(lab_run):
    from reskip.research.lab.session import LabSession

    return LabSession(lab_run)


TEXT = " ".join(f"w{i}" for i in range(3, 40))


def test_one_variable_at_a_time(session):
    from reskip.research.lab.variables import LabError, apply

    base, pf, n = session.base, session.policy_file, session.model.n_blocks
    assert base.budget == 1.0  # the run's budget of one block per step
    assert 2 in apply(base, {"variable": "skip_block", "block": 2, "value": "always"}, pf, n, True).policy.always
    assert 2 not in apply(base, {"variable": "skip_block", "block": 2, "value": "never"}, pf, n, True).policy.eligible
    assert apply(base, {"variable": "window", "value": 8}, pf, n, True).window == 8
    assert apply(base, {"variable": "budget", "value": 0.5}, pf, n, True).budget == 0.5
    assert apply(base, {"variable": "curriculum", "value": 0}, pf, n, True).curriculum == 0.0
    assert apply(base, {"variable": "skip_path", "value": "identity"}, pf, n, True).skip_path == "identity"
    for bad, words in [({"variable": ["tau", "window"], "value": 1}, "at once is refused"),
                       ({"tau": 0.5, "window": 3}, "at once is refused"),
                       ({"variable": "depth", "value": 1}, "unknown variable"),
                       ({"variable": "window", "value": 0}, "window must lie in"),
                       ({"variable": "tau", "block": 9, "value": 0.5}, "block must lie in"),
                       ({"variable": "budget", "value": 3}, "no budget 3"),
                       ({"variable": "skip_block", "block": 2, "value": "sometimes"}, "'always' or 'never'")]:
        with pytest.raises(LabError, match=words):
            apply(base, bad, pf, n, True)


def test_a_run_measures_the_change_against_the_baseline(session):
    from reskip.research.lab.variables import LabError

    r = session.run(TEXT, {"variable": "skip_block", "block": 2, "value": "always"},
                    {"direction": "worse", "amount_percent": 1})
    m = r["measured"]
    assert m["ppl_base"] > 0 and m["ppl_changed"] > 0 and len(r["tokens"]) == len(r["changed"]["skipped"])
    assert all(2 in s for s in r["changed"]["skipped"])  # skipped at every step (token)
    assert m["mean_skipped_changed"] >= 1 and m["direction"] in ("better", "worse", "unchanged")
    assert r["prediction_right"] == (m["direction"] == "worse") and len(r["history"]) >= 1
    same = session.run(TEXT, {"variable": "window", "value": session.base.window}, {"direction": "unchanged"})
    assert same["measured"]["delta_percent"] == 0.0 and same["measured"]["decisions_flipped"] == 0
    for text, change, pred, words in [(TEXT, {"variable": "window", "value": 2}, {}, "predict first"),
                                      ("", {"variable": "window", "value": 2}, {"direction": "better"}, "paste a text"),
                                      ("w5 " * 400, {"variable": "window", "value": 2}, {"direction": "better"},
                                       "at most 256")]:
        with pytest.raises(LabError, match=words):
            session.run(text, change, pred)
    from reskip.research.lab import session as lab_session

    limit, lab_session.MAX_HISTORY = lab_session.MAX_HISTORY, 2
    try:  # the history keeps the newest runs only
        last = session.run("w7 w8 w9", {"variable": "window", "value": 2}, {"direction": "better"})
        assert len(last["history"]) == 2 and last["history"][-1]["change"] == {"variable": "window", "value": 2}
    finally:
        lab_session.MAX_HISTORY = limit
    session.lock.acquire()
    try:
        with pytest.raises(LabError, match="a run is in progress"):
            session.run(TEXT, {"variable": "window", "value": 2}, {"direction": "better"})
    finally:
        session.lock.release()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(session):
    import uvicorn

    from reskip.research.lab.app import HOST, build_app

    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(build_app(session), host=HOST, port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(100):
        if srv.started:
            break
        time.sleep(0.05)
    yield f"http://{HOST}:{port}"
    srv.should_exit = True
    thread.join(timeout=10)


def _post(url, data: bytes):
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_bad_requests_get_a_clear_error_not_a_hung_server(server):
    code, body = _post(server + "/api/run", b"not json")
    assert code == 400 and body["error"].startswith("the request is not standard JSON")
    assert _post(server + "/api/run", b'{"text": "caf\xe9"}') == (400, {"error": "the request is not UTF-8 text"})
    for bad in (b'{"change": {"variable": "tau", "value": Infinity}}', b'{"change": {"value": 1e999}}'):
        code, body = _post(server + "/api/run", bad)
        assert code == 400 and "not standard JSON" in body["error"], bad
    good_prediction = {"direction": "better"}
    for change, said in (({"variable": {"name": "tau"}, "value": 0.5, "block": 2}, "unknown variable"),
                         ({"variable": "window", "value": True}, "whole number"),
                         ({"variable": "tau", "value": 0.5, "block": 1e300}, "must lie in [2, 3], got 1e+300"),
                         ({"variable": "curriculum", "value": False}, "must be a number"),
                         ({"variable": "curriculum", "value": "0.5"}, "must be a number"),  # typed, not coerced
                         ({"variable": "tau", "value": 0.5, "block": "3"}, "block must be a whole number"),
                         ({"variable": "window", "value": 2, "note": "x" * 60_000}, "a change takes variable")):
        code, body = _post(server + "/api/run", json.dumps({"text": TEXT, "change": change,
                                                            "prediction": good_prediction}).encode())
        assert code == 200 and said in body["error"], (change, body)
    code, body = _post(server + "/api/run", json.dumps({"text": TEXT, "change": {"variable": "window", "value": 2},
                                                        "prediction": {"direction": "better",
                                                                       "amount_percent": True}}).encode())
    assert code == 200 and "must be a percentage (a number), got True" in body["error"]
    code, body = _post(server + "/api/run", json.dumps({"text": TEXT, "extra": 1}).encode())
    assert code == 400 and "unknown request field(s) 'extra'" in body["error"]
    code, body = _post(server + "/api/run", json.dumps({"text": TEXT, "change": {"variable": ["tau", "window"]},
                                                        "prediction": {"direction": "better"}}).encode())
    assert code == 200 and "at once is refused" in body["error"]  # the lab's own answer, shown in the page
    code, body = _post(server + "/api/run", b"{" + b" " * 70_000 + b"}")
    assert code == 413
    code, body = _post(server + "/api/run", b'{"text": ' + b"[" * 30_000 + b"]" * 30_000 + b"}")
    assert (code, body) == (400, {"error": "the request is nested too deeply"})
    code, body = _post(server + "/api/run", b'{"text": "a\\ud800b", "change": {"variable": "window", "value": 2}, '
                                            b'"prediction": {"direction": "better"}}')
    assert code == 200 and "lone surrogate" in body["error"]
    with urllib.request.urlopen(server + "/api/state", timeout=10) as r:  # still answering
        assert json.loads(r.read())["baseline"]["budget"] == 1.0


def test_a_declared_length_past_the_limit_is_refused_unread_and_other_sites_are_refused(server):
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(server)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=10)
    conn.putrequest("POST", "/api/run")
    conn.putheader("Content-Length", str(10**12))
    conn.endheaders()  # not one byte of the body sent: the answer comes from the header alone
    answer = conn.getresponse()
    assert answer.status == 413 and "at most" in json.loads(answer.read())["error"]
    conn.close()
    other_port = f"http://{where.hostname}:{where.port + 1}"  # another site on the same loopback address
    for headers in ({"Host": "evil.example:80"}, {"Origin": "http://evil.example"}, {"Origin": other_port},
                    {"Origin": f"https://{where.hostname}:{where.port}"}, {"Host": f"{where.hostname}:{where.port + 1}"}):
        req = urllib.request.Request(server + "/api/state", headers=headers)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 403 and "the lab answers" in json.loads(e.value.read())["error"]
    req = urllib.request.Request(server + "/api/state", headers={"Origin": server})
    with urllib.request.urlopen(req, timeout=10) as r:  # its own page
        assert r.status == 200


def test_a_port_left_in_time_wait_is_free_again():
    """A stopped server's port (its accepted connection closed first: TIME-WAIT on the server side) passes the
    check, as the server itself (SO_REUSEADDR) would bind it."""
    from reskip.research.lab.app import check_port

    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    srv.listen()
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = srv.accept()
    conn.close()  # the server closes first: its side of the connection waits in TIME-WAIT
    client.close()
    srv.close()
    check_port(port)


def test_a_busy_port_is_refused_before_anything_loads(capsys):
    from reskip.cli import main

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.listen()
        assert main(["lab", "/nonexistent-run", "--port", str(port)]) == 2
    err = capsys.readouterr()
    assert f"port {port}" in err.err and "in use" in err.err and "http://" not in err.out


def test_the_page_in_a_headless_browser(server):
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("chromium is missing: the README's test command installs Debian's chromium package")
    errors = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(server + "/")
        page.wait_for_selector("#variable option[value=skip_block]", state="attached")
        page.select_option("#samples", "0")  # a text of the run's test split, picked
        assert page.input_value("#text").strip()
        page.fill("#text", TEXT)
        page.select_option("#variable", "skip_block")
        page.fill("#block", "2")
        page.fill("#value", "always")
        page.click("#run")  # no prediction yet: refused, in the page
        page.wait_for_function("document.getElementById('error').textContent.includes('predict first')")
        page.check("input[name=direction][value=worse]")
        page.fill("#amount", "2")
        page.click("#run")
        page.wait_for_selector("#delta", timeout=60_000)
        text = page.inner_text("#result")
        assert "Measured:" in text and "Your prediction" in text
        assert page.locator("#tokens .tok").count() == len(session_tokens(page))
        assert "change" in page.inner_text("#history")
        page.select_option("#variable", "window")
        page.fill("#value", "0")  # a bad value: a clear error in the page, the server still fine
        page.click("#run")
        page.wait_for_function("document.getElementById('error').textContent.includes('window must lie in')")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "lab.png"), full_page=True)
        browser.close()
    assert not errors, errors
    assert (ARTIFACTS / "lab.png").stat().st_size > 10_000


def session_tokens(page) -> list:
    return page.eval_on_selector_all("#tokens .tok", "els => els.map(e => e.textContent)")
