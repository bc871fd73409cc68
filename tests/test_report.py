"""The write-up of a run for an issue (`bisectr report`, `--report`, the TUI's `w`): Markdown with every
section, and one self-contained HTML page checked in a real browser (headless Chromium, driven by
Playwright; skipped with the reason where either is missing)."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import bisectr
from conftest import EXAMPLES, MODELS
from bisectr.measure.result import Bracket, OpSite
from bisectr.present.writeup import SECTIONS, html_page, markdown, write_report

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def tanh_gelu(tmp_path_factory) -> bisectr.Run:
    run = bisectr.trace(EXAMPLES / "tanh_gelu.py", out=tmp_path_factory.mktemp("report") / "run")
    run.bisect()
    run.save()
    return run


def headings(text: str) -> list[str]:
    return re.findall(r"^###? (.+?)(?::|$)", text, re.M)


def test_the_markdown_has_every_section_of_a_divergent_run(tanh_gelu):
    text = markdown(tanh_gelu)
    assert text.startswith("## bisectr: divergent in `tanh_gelu.py`")
    assert headings(text) == ["bisectr", "Sides", "Verdict", "Culprit", "Evidence", "Environment"]
    assert "**divergent**: a semantic difference reaches the outputs" in text
    # both sides' culprit lines in context, the line itself marked
    assert ">   82              h = F.gelu(h, approximate=True)" in text
    assert ">   87              h = F.gelu(h)" in text
    assert "| candidate | 222 `_C_ops.gelu` | `layers.7.ffn` | `examples/_paddle_blocks.py:82` |" in text
    assert re.search(
        r"- confirmed: taking out only op 222's own difference takes the outputs' error from [\d.e-]+ to [\d.e-]+", text
    )
    versions = dict(re.findall(r"^\| (\w+) \| `([^`]+)` \|$", text, re.M))
    assert (
        versions["torch"].startswith("2.13")
        and versions["paddle"].startswith("3.3")
        and versions["python"].count(".") == 2
    )
    assert versions["bisectr"] and versions["cpu"]


def test_recurrences_differing_leaves_and_a_bracket_have_their_sections(tanh_gelu, tmp_path):
    wrong_eps = bisectr.trace(EXAMPLES / "wrong_eps.py", out=tmp_path / "eps")
    wrong_eps.bisect()
    assert "### Recurrences" in markdown(wrong_eps) and "| share |" in markdown(wrong_eps)
    weight = bisectr.trace(EXAMPLES / "untransposed_weight.py", out=tmp_path / "weight")
    weight.bisect()
    assert re.search(
        r"### Parameters and buffers that differ\n\n.*\n.*\n\| `param:blocks.1.attn.q_proj.weight` \|", markdown(weight)
    )
    site = OpSite(222, "_C_ops.gelu", "layers.7.ffn", f"{EXAMPLES / '_paddle_blocks.py'}:82")
    tanh_gelu.result.bracket = Bracket(220, 223, [site], [site], why="no op's replay confirms it")
    try:
        text = markdown(tanh_gelu)
    finally:
        tanh_gelu.result.bracket = None
    assert "### Where the difference enters\n\n```text\nno op's replay confirms it." in text
    assert set(SECTIONS) <= set(headings(markdown(wrong_eps)) + headings(markdown(weight)) + headings(text))


def test_bisectr_report_writes_both_files_into_the_run_directory(tanh_gelu):
    done = subprocess.run(
        [sys.executable, "-m", "bisectr", "report", str(tanh_gelu.run_dir)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    written = [Path(tanh_gelu.run_dir) / name for name in ("report.md", "report.html")]
    assert done.stdout.strip() == f"report written: {written[0]}, {written[1]}"
    page = written[1].read_text()
    assert "<h3>Error by op</h3>" in page and "every paired op (" in page and "repro script" in page
    assert not re.search(
        r"""<(script|link|img)[^>]*(src|href)=["']https?:""", page
    )  # nothing fetched when it is opened
    assert markdown(bisectr.load(tanh_gelu.run_dir)) == written[0].read_text()  # the saved run gives the same write-up


def test_a_path_that_cannot_be_written_is_status_2_naming_it(tanh_gelu, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "bisectr", "report", str(tanh_gelu.run_dir), "-o", str(blocker / "report")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and f"{blocker}: cannot write the report" in done.stderr, done.stderr


def test_report_on_bisect_and_in_json(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bisectr",
            "bisect",
            str(EXAMPLES / "wrong_eps.py"),
            "--json",
            "--report",
            str(tmp_path / "eps.md"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["report"] == [str(tmp_path / "eps.md"), str(tmp_path / "eps.html")]
    assert (tmp_path / "eps.md").read_text().startswith("## bisectr: divergent in `wrong_eps.py`")


def test_without_bokeh_the_page_says_so_and_keeps_the_rest(tanh_gelu, monkeypatch):
    monkeypatch.setitem(sys.modules, "bokeh", None)
    monkeypatch.setitem(sys.modules, "bokeh.embed", None)
    page = html_page(tanh_gelu)
    assert "the plots need bokeh: <code>pip install 'bisectr[report]'</code>" in page
    assert (
        "<h3>Culprit: <code>gelu</code>, the first semantic difference</h3>" in page and '<table class="ops">' in page
    )


def test_a_training_report_has_both_loss_curves_and_the_step_errors(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bisectr",
            "train",
            str(MODELS / "training_ports.py"),
            "--steps",
            "3",
            "--no-tui",
            "--report",
            str(tmp_path / "train"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 1), done.stderr
    text = (tmp_path / "train.md").read_text()
    assert text.startswith("## bisectr train:") and "### Steps" in text and text.count("\n| 3 |") == 1
    page = (tmp_path / "train.html").read_text()
    assert "<h3>Loss curves</h3>" in page and "<h3>Error per step</h3>" in page


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (Debian: apt-get install chromium)")
def test_the_page_loads_in_a_browser_with_the_plot_and_the_culprit_visible(tanh_gelu, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (the test extra)")
    from PIL import Image

    [_, page_file] = write_report(tanh_gelu, tmp_path / "report")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        problems, requests = [], []
        page.on("console", lambda message: message.type in ("error", "warning") and problems.append(message.text))
        page.on("pageerror", lambda error: problems.append(str(error)))
        page.on("request", lambda request: requests.append(request.url))
        page.goto(page_file.as_uri())
        page.wait_for_function("() => window.Bokeh && Bokeh.documents.length === 1")
        page.wait_for_timeout(500)  # the figure is drawn after the document is ready
        plot = page.locator("canvas").first  # BokehJS draws in a shadow root, which locators pierce
        plot.scroll_into_view_if_needed()
        box = plot.bounding_box()
        culprit = page.get_by_role("heading", name="Culprit: gelu, the first semantic difference")
        assert culprit.is_visible() and page.get_by_text("h = F.gelu(h, approximate=True)").first.is_visible()
        page.get_by_text("every paired op").click()  # open the op table, sort by local error
        page.locator("table.ops th", has_text="local error").click()
        page.locator("table.ops th", has_text="local error").click()
        top = page.locator("table.ops tbody tr").first.locator("td").first.inner_text()
        shot = Image.open(io.BytesIO(page.screenshot(clip=box)))
        browser.close()
    assert problems == [] and all(url.startswith("file:") for url in requests), (problems, requests)
    assert box["width"] > 600 and box["height"] > 250
    assert top == "222"  # sorted descending by local error, the culprit first
    # Structure, not pixels: the figure holds the two series' colours and the culprit's marker.
    colours = {colour for _, colour in shot.convert("RGB").getcolors(maxcolors=1 << 20)}

    def near(target):
        return any(sum(abs(a - b) for a, b in zip(colour, target)) < 60 for colour in colours)

    assert near((0x09, 0x69, 0xDA)) and near((0xCF, 0x22, 0x2E))  # propagated (blue), local and the culprit (red)


def test_the_committed_example_reports_are_what_bisectr_writes(tmp_path):
    for name in ("span_head", "tanh_gelu"):
        committed = (ROOT / "docs" / "reports" / f"{name}.md").read_text()
        run = bisectr.trace(EXAMPLES / f"{name}.py", out=tmp_path / name)
        run.bisect()
        assert headings(markdown(run)) == headings(committed)
        assert (ROOT / "docs" / "reports" / f"{name}.html").stat().st_size < 2_000_000
    assert "docs/reports/tanh_gelu.png" in (ROOT / "README.md").read_text()
    assert os.path.isfile(ROOT / "docs" / "reports" / "tanh_gelu.png")
