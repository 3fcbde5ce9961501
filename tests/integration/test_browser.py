"""What a person sees: the links podium prints, opened in headless Chromium (Debian's package), as a
new user would, on the embedded defaults, with port 4200 held by another server.

Two trainings:
- the module's `podium run` (2 epochs, its own local Ray), started while another project folder's
  `podium server start` races it for a port: it carries the Prefect flow run's page (a validation per
  checkpoint), the chart artifact, MLflow's pages (runs, the run, the chart, the models, the registry),
  and the approval form (`podium promote --approval required` of that run, which trains nothing);
- the nightly deployment's run, by a `podium worker`: its flow run's page.

Screenshots go to $PODIUM_SCREENSHOTS if set (the README's timeline picture was taken this way), else to the
test's temporary folder.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.browser]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1600, "height": 1000}
RUN = "browser-demo"

if not os.path.exists(CHROMIUM):
    pytest.skip(f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium)", allow_module_level=True)


class _AnotherServer(http.server.BaseHTTPRequestHandler):
    """Whatever else listens on 4200: answers every request, as another project's server would."""

    def do_GET(self) -> None:
        body = json.dumps({"server": "another project's"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def port_4200_held():
    """Port 4200 taken by another server for the module (if something already holds it, that one)."""
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 4200), _AnotherServer)
    except OSError:
        with socket.create_connection(("127.0.0.1", 4200), timeout=5):
            pass  # held already, by something that accepts connections
        yield
        return
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield
    server.shutdown()
    server.server_close()


def _podium(args: list[str], env: dict[str, str], cwd: Path) -> str:
    proc = subprocess.run([sys.executable, "-m", "podium.cli", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"podium {args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc.stdout


def _link(text: str, pattern: str) -> str:
    m = re.search(pattern, text)
    assert m, f"no link like {pattern!r} in:\n{text}"
    return m.group(1)


def _embedded_env(work: Path) -> dict[str, str]:
    """A project folder on the embedded defaults: no servers configured, its own PODIUM_HOME."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "RAY_ADDRESS", "PODIUM_MLFLOW_UI_URL")}
    return env | {"PODIUM_HOME": str(work / ".podium")}


def _run_while_another_folder_starts_its_server(work: Path, other: Path, dataset) -> str:
    """`podium run` in `work` on the embedded defaults, and `podium server start` in another project folder, at the
    same moment: each starts its own Prefect server (port 4200 is taken, so each picks a free port, and both may
    pick the same one before either binds it: the same `ensure_prefect_server` a `podium run` starts its server
    with) and each succeeds, on two servers. The other folder's server is stopped; `work`'s output is returned,
    its server left up for the UI. The other folder trains nothing: what matters of it is its server's start."""
    data = ["--train-data", dataset[0], "--val-data", dataset[1]]
    procs = [subprocess.Popen([sys.executable, "-m", "podium.cli", *args], env=_embedded_env(folder), cwd=folder,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for folder, args in [(work, ["run", "--run-name", RUN, "--epochs", "2", *data]),
                                  (other, ["server", "start"])]]
    outs = [p.communicate(timeout=600) for p in procs]
    try:
        for (out, err), proc in zip(outs, procs):
            assert proc.returncode == 0, f"exit {proc.returncode}:\n{out}\n{err[-4000:]}"
        servers = {_link(out, r"Prefect UI:\s+http://127\.0\.0\.1:(\d+)") for out, _ in outs}
        assert len(servers) == 2 and "4200" not in servers, servers
    except BaseException:
        _stop_server(work)  # the caller keeps it only for a run that went through
        raise
    finally:
        _stop_server(other)
    return outs[0][0]


def _stop_server(folder: Path) -> None:
    """`podium server stop` in a project folder, whatever state its run left."""
    subprocess.run([sys.executable, "-m", "podium.cli", "server", "stop"], env=_embedded_env(folder), cwd=folder,
                   capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def run(tmp_path_factory, dataset, port_4200_held):
    """The module's `podium run`, on the embedded defaults (its own Prefect server, MLflow on SQLite, its own local
    Ray), started together with another folder's server, then `podium ui`."""
    work = tmp_path_factory.mktemp("browser")
    env = _embedded_env(work)
    out = _run_while_another_folder_starts_its_server(work, tmp_path_factory.mktemp("other-project"), dataset)
    steps = [int(s) for s in re.findall(r"^\s+step\s+(\d+)\s+validated", out, re.M)]
    ui = subprocess.Popen([sys.executable, "-m", "podium.cli", "ui"], env=env, cwd=work, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    printed = ""
    try:
        for line in ui.stdout:  # type: ignore[union-attr]
            printed += line
            if "until Ctrl-C" in line or ui.poll() is not None:
                break
        assert "until Ctrl-C" in printed, printed
        yield links(out, printed) | {"steps": steps, "work": work}
    finally:
        ui.terminate()
        ui.wait(timeout=60)
        _podium(["server", "stop"], env, work)


def links(run_output: str, ui_output: str) -> dict[str, str]:
    """The links `podium run` and `podium ui` printed."""
    return {"prefect": _link(run_output, r"Prefect UI:\s+(http://\S+/runs/flow-run/\S+)"),
            "experiment": _link(ui_output, r"MLflow UI:\s+(http://\S+)"),
            "run": _link(ui_output, r"(http://\S+/runs/[0-9a-f]{32}\S*)"),
            "models": _link(ui_output, r"(http://\S+/models\?\S*)"),
            "chart": _link(ui_output, r"(http://\S+/artifacts/podium/val_loss_per_checkpoint\.png\S*)\s+\(checkpoints side"),
            "registry": _link(ui_output, r"(http://\S+/#/models/[^/\s]+)\s")}


@pytest.fixture(scope="module")
def nightly(run, dataset):
    """The project's nightly deployment (`python -m podium.deployments deploy`), run once on demand by a
    `podium worker`, as docs/operations.md shows: the finished flow run, read through the API."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    work = run["work"]
    env = _embedded_env(work)
    config = work / "nightly.json"
    config.write_text(json.dumps({"run_name": "browser-nightly", "data": {"train": dataset[0], "val": dataset[1]},
                                  "training": {"epochs": 2}, "scaling": {"num_workers": 1}}))
    deploy = subprocess.run([sys.executable, "-m", "podium.deployments", "deploy", "--pool", "browser", "--config",
                             str(config)], env=env, cwd=work, capture_output=True, text=True, timeout=300)
    assert deploy.returncode == 0, f"{deploy.stdout}\n{deploy.stderr[-4000:]}"
    api = _link(deploy.stdout, r"export PREFECT_API_URL=(\S+)")
    log = work / "worker.log"
    worker = subprocess.Popen([sys.executable, "-m", "podium.cli", "worker", "--pool", "browser", "--limit", "1"],
                              env={**env, "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "5"},
                              cwd=work, stdout=log.open("wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        # the sync client: Playwright's sync API keeps an event loop running in this thread
        with temporary_settings(updates={PREFECT_API_URL: api}), get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name("train-validate-promote/nightly-training")
            started = client.create_flow_run_from_deployment(deployment.id)
            deadline = time.monotonic() + 420
            while not ((ran := client.read_flow_run(started.id)).state and ran.state.is_final()):
                assert time.monotonic() < deadline, f"the nightly run did not end:\n{log.read_text()[-4000:]}"
                time.sleep(1)
        assert ran.state.is_completed(), f"{ran.state}\n{log.read_text()[-4000:]}"
        yield {"flow_run": ran, "ui": api.removesuffix("/api")}
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            # on SIGTERM Prefect's worker waits for its flow run's process to exit; on a loaded machine that took
            # minutes after the flow had Completed (the flow-run supervisor has a process group of its own)
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=60)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, tmp_path):
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.shots = Path(os.environ.get("PODIUM_SCREENSHOTS") or tmp_path)  # type: ignore[attr-defined]
    page.shots.mkdir(parents=True, exist_ok=True)  # type: ignore[attr-defined]
    yield page
    context.close()


def _no_horizontal_scroll(page) -> bool:
    """Neither the page nor any scrolling box inside it is wider than what is shown."""
    return page.evaluate("""() => document.documentElement.scrollWidth <= innerWidth &&
        [...document.querySelectorAll('*')].every(e => e.scrollWidth <= e.clientWidth + 1 ||
            ['visible', 'hidden', 'clip'].includes(getComputedStyle(e).overflowX))""")


def _in_view(locator) -> bool:
    box = locator.bounding_box()
    return box is not None and box["x"] >= 0 and box["x"] + box["width"] <= VIEWPORT["width"] and \
        box["y"] + box["height"] <= VIEWPORT["height"]


def _close_mlflow_assistant(page) -> None:
    """MLflow 3.17 opens its Assistant panel on a browser's first visit; a person closes it once."""
    close = page.get_by_role("button", name="Close")
    try:
        close.first.click(timeout=5_000)
    except Exception:
        pass  # not shown


def test_prefect_link_opens_this_runs_page_with_a_validation_per_checkpoint(run, page):
    prefect = run["prefect"]
    assert ":4200/" not in prefect, "port 4200 is another server's: podium's own server must be elsewhere"
    base = prefect.split("/runs/")[0]
    with urllib.request.urlopen(f"{base}/ui-settings", timeout=10) as r:
        assert json.load(r)["api_url"] == f"{base}/api"  # the UI reads its own server, not 4200
    page.goto(prefect)
    page.get_by_text(f"{RUN}-run").first.wait_for()
    page.screenshot(path=str(page.shots / "prefect-flow-run.png"))
    page.get_by_text("Task Runs", exact=True).click()
    for step in run["steps"]:
        page.get_by_text(f"validate-step-{step}", exact=False).first.wait_for()
    names = set(re.findall(r"validate-step-\d+", page.inner_text("body")))
    assert names == {f"validate-step-{s}" for s in run["steps"]} and len(run["steps"]) == 2
    page.screenshot(path=str(page.shots / "prefect-task-runs.png"))


def test_a_nightly_deployment_run_reads_like_a_podium_run(nightly, page):
    """Run by a worker from the deployment: named as `podium run` names its runs, ended Completed with a message
    that says what it promoted, podium's own progress lines in its log, on the flow run's page in Chromium."""
    ran = nightly["flow_run"]
    assert re.fullmatch(r"browser-nightly-\d{8}-run", ran.name), ran.name
    assert ran.state.message.startswith("promoted step ") or ran.state.message.startswith("nothing promoted: ")
    page.goto(f"{nightly['ui']}/runs/flow-run/{ran.id}")
    page.get_by_text(ran.name).first.wait_for()
    page.get_by_text("Completed").first.wait_for()
    page.get_by_text("training done:", exact=False).first.wait_for()  # the Logs tab: podium's lines
    page.get_by_text("promotion: step", exact=False).first.wait_for()
    page.screenshot(path=str(page.shots / "prefect-nightly-run.png"))


def test_chart_artifact_renders_as_a_chart(run, page):
    base = run["prefect"].split("/runs/")[0]
    req = urllib.request.Request(f"{base}/api/artifacts/filter", method="POST",
                                 data=json.dumps({"artifacts": {"key": {"any_": [f"{RUN}-chart"]}}}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        (artifact,) = json.load(r)
    page.goto(f"{base}/artifacts/artifact/{artifact['id']}")
    chart = page.locator("img[src^='data:image/png']").first
    chart.wait_for()
    page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=chart.element_handle())
    size = chart.evaluate("img => [img.naturalWidth, img.naturalHeight, img.clientWidth]")
    assert size[0] > 600 and size[1] > 300 and size[2] > 400, size  # drawn, and shown at a readable size
    for step in run["steps"]:  # the table under the chart: every checkpoint, the winner starred
        assert page.get_by_role("cell", name=str(step), exact=True).count() >= 1
    assert page.get_by_text("★ promoted as v000001").count() == 1
    page.screenshot(path=str(page.shots / "prefect-chart.png"), full_page=True)


def test_mlflow_opens_on_runs_and_shows_checkpoints_and_the_champion(run, page):
    page.goto(run["experiment"])
    _close_mlflow_assistant(page)
    page.get_by_role("link", name=RUN).first.wait_for()
    assert "/runs" in page.url and "traces" not in page.url and "overview" not in page.url
    outcome = page.get_by_text(re.compile(r"^promoted step \d+ as v000001")).first
    outcome.wait_for()  # the outcome column of the runs table, shown whole
    assert _in_view(outcome) and outcome.evaluate("e => e.scrollWidth <= e.clientWidth")
    page.screenshot(path=str(page.shots / "mlflow-runs.png"))

    page.goto(run["run"])
    logged = page.get_by_text(f"Logged models ({len(run['steps'])})")
    logged.wait_for()
    for step in run["steps"]:
        assert page.get_by_text(f"{RUN}-step-{step}").count() >= 1
    logged.scroll_into_view_if_needed()
    page.screenshot(path=str(page.shots / "mlflow-run.png"))

    page.goto(run["chart"])  # checkpoints side by side: the run's chart of the metric per checkpoint, in view at once
    chart = page.get_by_role("img", name="podium/val_loss_per_checkpoint.png")
    chart.wait_for()
    page.wait_for_function("img => img.complete && img.naturalWidth > 600", arg=chart.element_handle())
    assert _in_view(chart), chart.bounding_box()
    page.screenshot(path=str(page.shots / "mlflow-chart.png"))

    page.goto(run["models"])  # every checkpoint's LoggedModel, the promoted one registered
    for step in run["steps"]:
        page.get_by_text(f"{RUN}-step-{step}").first.wait_for()
    page.screenshot(path=str(page.shots / "mlflow-models.png"))

    page.goto(run["registry"])  # the registered model: which version is the champion, and its metric
    champion = page.get_by_text(re.compile(r"^@\s*champion$")).first  # the alias tag
    champion.wait_for()
    winner = page.get_by_text(re.compile(r"^val_loss = 0\.\d{1,4} \(min\), step")).first  # the UI cuts the rest
    winner.wait_for()
    page.screenshot(path=str(page.shots / "mlflow-registry.png"))
    assert _in_view(champion) and _in_view(winner) and _no_horizontal_scroll(page)


def _submit_resume_form(page, form) -> str:
    """Submit the Resume form as a person would and wait for the Prefect server's answer: what it said (ACCEPT, or
    why not). What a person does again, this does again while the form stays open, at most 4 times in all:
    - a click that did not reach the form (a busy machine's browser still laying it out) sends nothing;
    - a server on SQLite (the embedded defaults) answers 503 "Service Unavailable" when another of its writers
      committed during the resume's transaction (SQLITE_BUSY_SNAPSHOT, which Prefect calls retryable); the UI
      shows "Failed to resume flow run" and keeps the form open."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    tries = []
    for attempt in range(4):
        try:
            with page.expect_response(lambda r: "/resume" in r.url and r.request.method == "POST",
                                      timeout=30_000) as response:
                form.get_by_role("button", name="Submit").click()
        except PlaywrightTimeout:
            tries.append("nothing sent")
        else:
            if response.value.status != 503:
                break
            tries.append("503 Service Unavailable")
        if not form.is_visible():
            raise AssertionError(f"the form closed after {tries} without the run resumed") from None
        page.screenshot(path=str(page.shots / f"prefect-approval-form-try-{attempt}.png"))
        time.sleep(2)
    else:
        raise AssertionError(f"Submit was answered {tries}; the form says:\n{form.inner_text()}")
    body = response.value.json()
    assert response.value.ok and body.get("status") == "ACCEPT", f"resume answered {response.value.status}: {body}"
    return ", ".join([*tries, body["status"]])


def _flow_run_state(base: str, flow_run: str) -> str:
    from helpers.prefect_queries import flow_run_state
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: f"{base}/api"}):
        state = flow_run_state(run_id=flow_run, timeout=0)  # as it is now, final or not
    return f"{state.type.value if state else None}: {state.message if state else ''}"


def test_the_prefect_ui_form_approves_a_candidate_awaiting_approval(run, dataset, page):
    """`podium promote --approval required` of the module's run, to a serving location of its own: the flow run
    pauses, and a person answers the form the Prefect UI shows on it (its Resume button)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from podium.prefect_api import paused_flow_run
    from podium.serving.layout import read_history

    work, base = run["work"], run["prefect"].split("/runs/")[0]
    serving = work / "serving-approved"
    proc = subprocess.Popen([sys.executable, "-m", "podium.cli", "promote", "--json", "--run-name", RUN,
                             "--train-data", dataset[0], "--val-data", dataset[1], "--serving", str(serving),
                             "--alias", "approved", "--approval", "required"], env=_embedded_env(work), cwd=work,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        with temporary_settings(updates={PREFECT_API_URL: f"{base}/api"}):
            while True:
                try:
                    flow_run = paused_flow_run(RUN)
                    break
                except LookupError:
                    assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=60)
                    time.sleep(1)
        page.goto(f"{base}/runs/flow-run/{flow_run}")
        page.get_by_role("button", name="Resume").first.click()
        form = page.locator(".p-modal__card")
        form.get_by_text(re.compile(rf"Promote step \d+ of run {RUN}\?")).wait_for()
        assert "Champion: none (this is the first promotion)" in form.inner_text()
        form.locator(".schema-form-property", has_text="Decision").locator("button").last.focus()
        page.keyboard.press("ArrowDown")  # the select's options open from the keyboard
        page.get_by_role("option", name="approve").click()
        form.locator(".schema-form-property", has_text="Reason").locator("textarea").fill("read the report: ship it")
        form.locator(".schema-form-property", has_text="By").locator("textarea").fill("ana")
        page.screenshot(path=str(page.shots / "prefect-approval-form.png"))
        answer = _submit_resume_form(page, form)
        try:
            out, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the form was answered ({answer}) but the run did not go on; the flow run is "
                                 f"{_flow_run_state(base, flow_run)}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{out[-2000:]}\n{err[-4000:]}"
    outcome = json.loads(out.strip().splitlines()[-1])
    assert outcome["promoted"]["version"] == "v000001", outcome["promotion_reason"]
    assert outcome["promotion_reason"].endswith("; approved by ana: read the report: ship it")
    [switch] = read_history(str(serving))
    assert switch["origin"]["approval"]["via"] == "the Prefect UI"
