"""The web app's Gradio page: its tabs laid out over :mod:`~vit_flowers.app.engine` and
:mod:`~vit_flowers.app.page`, and serving it."""

from __future__ import annotations

import html
import ipaddress
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..data.images import ImageLoadError, load_image
from ..runs.errors import CheckpointError
from .downloads import model_onnx, model_web
from .engine import FOLDER_COLUMNS, Engine, Taught, model_card, run_zip, teach_class
from .label_tab import KEYS_JS, label_tab
from .labelling import LABEL_CSS
from .page import (
    CSS,
    cells_html,
    classify_html,
    classify_page,
    folder_page,
    model_card_markdown,
    onnx_markdown,
    progress_html,
    web_markdown,
)
from .run_list import list_runs, run_info
from .train_tab import train_tab

__all__ = ["gradio", "header_markdown", "run_choices", "model_tab_values", "taught_markdown", "build_page", "launch",
           "is_loopback", "wait_until_serving"]

logger = logging.getLogger(__name__)


def gradio() -> Any:
    """Gradio, imported with its analytics off (set before the import), or SystemExit with the install line."""
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    try:
        import gradio as gr
    except ImportError:
        raise SystemExit('error: the web app needs Gradio: pip install -e ".[app]"') from None
    return gr


def _figure(path: Path | None) -> Any:
    """A figure of the run folder, or None (missing, or damaged: it costs its own panel, not the page)."""
    try:
        return load_image(path) if path is not None else None
    except ImageLoadError as exc:
        logger.warning("%s", exc)
        return None


def model_tab_values(engine: Engine) -> tuple[str, str, Any, Any]:
    """The Model tab's text, clickable confusion matrix, confusion matrix figure and training curves for the model
    in use."""
    if engine.loaded is None:
        return "No model yet: train one in the Train tab.", "", None, None
    card = model_card(engine.loaded)
    url = f"gradio_api/file={card.report.resolve()}" if card.report else None
    return (model_card_markdown(card, url), cells_html(card, engine.classes), _figure(card.confusion),
            _figure(card.curves))


def _model_tab(gr: Any, engine: Engine) -> list[Any]:
    """The Model tab's components (refreshed when the page switches model)."""
    text, cells, confusion, curves = model_tab_values(engine)
    parts = [gr.Markdown(text, elem_id="vf-model-card"), gr.HTML(cells, label="mistakes", elem_id="vf-model-cells")]
    with gr.Row():
        for value, label in ((confusion, "confusion matrix (validation)"), (curves, "training curves")):
            with gr.Column():  # the caption above the figure: Gradio's own label would cover its top corner
                gr.Markdown(f"**{label.capitalize()}**")
                parts.append(gr.Image(value=value, label=label, show_label=False, interactive=False,
                                      buttons=["download", "fullscreen"]))  # no "share" (to Hugging Face)
    with gr.Row():
        pack = gr.Button("Download the run folder (zip)", elem_id="vf-model-zip", size="sm", scale=0)
        packed = gr.File(label="run.zip", interactive=False, elem_id="vf-model-zip-file")

    def zipped() -> str | None:
        try:
            return str(run_zip(engine))
        except (ValueError, OSError) as exc:  # no model yet, a full disk: a message, the page stays up
            gr.Warning(f"Could not zip the run: {exc}")
            return None

    pack.click(zipped, None, packed, concurrency_id="zip", api_name="run_zip")
    _onnx_row(gr, engine)
    return parts


def _download_row(gr: Any, what: str, elem: str, make: Callable[[], tuple[str, str]]) -> None:
    """A Model tab download: a button that makes the file (``make``: its path and what the page says of it), the
    file offered, and what was said, or why it could not be made."""
    with gr.Row():
        go = gr.Button(f"Download {what}", elem_id=f"vf-model-{elem}", size="sm", scale=0)
        offered = gr.File(label=what, interactive=False, elem_id=f"vf-model-{elem}-file")
    said = gr.Markdown(label=what, elem_id=f"vf-model-{elem}-check")

    def made() -> tuple[str | None, str]:
        try:
            return make()
        except (ValueError, CheckpointError, OSError) as exc:  # no extra, no model, a disagreement, a full disk
            logger.warning("download %s: %s", what, exc)
            return None, f"**Could not export {what}:** {html.escape(str(exc))}"

    go.click(made, None, [offered, said], concurrency_id=elem, api_name=f"model_{elem}")


def _onnx_row(gr: Any, engine: Engine) -> None:
    """The Model tab's downloads: the model as ONNX, exported and checked against PyTorch, and as a web page
    (export --web's folder, zipped)."""

    def onnx() -> tuple[str, str]:
        done = model_onnx(engine)
        return str(done.path), onnx_markdown(done)

    def web() -> tuple[str, str]:
        done = model_web(engine)
        return str(done.path), web_markdown(done.path.name, done.onnx, done.runtime_included)

    _download_row(gr, "the model as ONNX", "onnx", onnx)
    _download_row(gr, "as a web page (zip)", "web", web)


def _folder_tab(gr: Any, engine: Engine) -> None:
    with gr.Row():
        folder = gr.Textbox(label="A folder on this computer", placeholder="/home/me/Pictures/garden", scale=4,
                            elem_id="vf-folder")
        recursive = gr.Checkbox(value=True, label="include sub-folders")
        go = gr.Button("Predict every image", variant="primary", elem_id="vf-folder-go")
    summary = gr.Markdown(label="summary", elem_id="vf-folder-summary")
    csv_file = gr.File(label="predictions.csv", interactive=False)
    gallery = gr.HTML(label="gallery", elem_id="vf-folder-gallery")
    table = gr.Dataframe(headers=FOLDER_COLUMNS, label="every file", interactive=False, wrap=True)

    # Gradio's own idiom: it sees the default and injects its progress tracker
    def run(path: str, sub: bool, progress: Any = gr.Progress()) -> tuple:  # noqa: B008
        text, page, rows, csv_path = folder_page(engine, path, sub, lambda n, total: progress((n, total)))
        return text, csv_path, page, rows

    go.click(run, [folder, recursive], [summary, csv_file, gallery, table], concurrency_id="model", api_name="folder")
    folder.submit(run, [folder, recursive], [summary, csv_file, gallery, table], concurrency_id="model",
                  api_visibility="private")


def header_markdown(engine: Engine) -> str:
    """The page's header: what the model in use knows (shown again after teaching, training or a switch)."""
    if engine.loaded is None:
        return "## vit_flowers: make your own classifier\nNo model yet: make your classes in the Train tab."
    return (f"## vit_flowers: which flower is it?\nThe model knows {len(engine.classes)} classes: "
            f"{', '.join(engine.classes)}.")


def run_choices(engine: Engine) -> tuple[list[tuple[str, str]], str | None]:
    """The model selector's (label, run folder) choices, the newest first, and the run in use (listed even when
    it lives elsewhere)."""
    choices = [(info.label, str(info.path.resolve())) for info in list_runs(engine.runs_home)]
    if engine.loaded is None:
        return choices, None
    current = str(Path(engine.loaded.path).resolve().parent)
    if current not in (path for _, path in choices):
        info = run_info(Path(current))
        choices.insert(0, (info.label if info else Path(current).name, current))
    return choices, current


def taught_markdown(taught: Taught) -> str:
    """The Teach tab's result: what the model knows now, the warnings, the estimate of the taught class and where
    the new run is kept."""
    lines = [f"**{taught.name}** taught from {taught.photos} photo(s). The model now knows {len(taught.classes)} "
             f"classes: {', '.join(taught.classes)}; the Classify tab uses it."]
    lines += [f"**Warning:** {warning}" for warning in taught.warnings]
    lines += [f"**Estimate:** {estimate}" for estimate in taught.estimates]
    lines.append(f"New run, kept after the page stops: `{taught.run_dir}`. On the command line: `{taught.command}`")
    return "\n\n".join(lines)


def _teach_tab(gr: Any, engine: Engine, header: Any) -> None:
    """Drop 5-20 photos, name the flower: a new run, which the Classify tab uses from then on (``header``: the
    page's header, which counts the classes)."""
    photos = gr.File(label="Photos of one flower (5-20)", file_count="multiple", file_types=["image"],
                     elem_id="vf-teach-photos", height=160)
    name = gr.Textbox(label="Its name", placeholder="lily", elem_id="vf-teach-name")
    go = gr.Button("Teach it", variant="primary", elem_id="vf-teach-go")
    result = gr.Markdown(label="taught", elem_id="vf-teach-result")

    def run(paths: list[str] | None, text: str) -> tuple[str, str]:
        try:
            taught = teach_class(engine, list(paths or []), text)
        except (CheckpointError, ValueError, OSError) as exc:  # a message for the user
            logger.warning("teach failed: %s", exc)
            return f"**Could not teach:** {exc}", header_markdown(engine)
        return taught_markdown(taught), header_markdown(engine)

    go.click(run, [photos, name], [result, header], concurrency_id="model", api_name="teach")


def _switch(engine: Engine, path: str | None) -> str:
    """The selector's choice: use that run; a message when it cannot be opened (the model in use kept)."""
    if not path or (engine.loaded is not None and str(Path(engine.loaded.path).resolve().parent) == path):
        return ""
    try:
        engine.switch(Path(path))
    except (CheckpointError, ValueError, OSError) as exc:
        logger.warning("cannot switch to %s: %s", path, exc)
        return f"**Could not open {path}:** {exc}"
    return ""


def build_page(engine: Engine, folders: bool = True) -> Any:
    """The Gradio page (Blocks, queued one model call at a time). ``folders``: build the Folder tab (and the Train
    tab's PHOTOS folder) at all (off, it does not exist on the server: no request can reach it).

    The functions behind each tab (:func:`classify_files`, :func:`predict_folder`, :func:`model_card` and their
    ``*_html`` renderers) work without Gradio; this only lays them out. Every output has a label: the name the
    API gives it (shown or not). A timer refreshes the training's progress every second and, when the model in
    use changed (trained, taught, chosen in another tab or browser), the header, the selector and the Model tab."""
    gr = gradio()
    with gr.Blocks(title="vit_flowers", analytics_enabled=False, delete_cache=(3600, 3600)) as demo:
        with gr.Row():
            header = gr.Markdown(header_markdown(engine), label="header", elem_id="vf-header")
            choices, current = run_choices(engine)
            selector = gr.Dropdown(choices, value=current, label="Model: the runs in " + str(engine.runs_home),
                                   elem_id="vf-model-select", scale=2)
        switched = gr.Markdown(elem_id="vf-model-switch")
        with gr.Tabs(selected="train" if engine.loaded is None else "classify"):
            with gr.Tab("Classify", id="classify"):
                with gr.Row():
                    files = gr.File(label="Photos: drop, or click to choose, one or several", file_count="multiple",
                                    elem_id="vf-upload", height=160)
                    camera = gr.Image(label="Or paste a photo / use the webcam", sources=["clipboard", "webcam"],
                                      type="filepath", elem_id="vf-camera", height=160, buttons=[])
                results = gr.HTML(classify_html([], engine.rule), label="predictions", elem_id="vf-results")

                def classify(paths: list[str] | str | None) -> str:
                    return classify_page(engine, paths)

                files.upload(classify, files, results, concurrency_id="model", api_name="classify")
                files.delete(classify, files, results, concurrency_id="model", api_visibility="private")  # the rest
                files.clear(lambda: classify_html([], engine.rule), None, results, api_visibility="private")
                camera.input(classify, camera, results, concurrency_id="model", api_visibility="private")
            with gr.Tab("Train", id="train"):
                train = train_tab(gr, engine, folders)
            labelling = None
            if folders:
                with gr.Tab("Folder", id="folder"):
                    _folder_tab(gr, engine)
                with gr.Tab("Label", id="label"):
                    labelling = label_tab(gr, engine)
            with gr.Tab("Teach", id="teach"):
                _teach_tab(gr, engine, header)
            with gr.Tab("Model", id="model"):
                model_parts = _model_tab(gr, engine)
        seen = gr.State(engine.version)
        timer = gr.Timer(1.0)

        def refresh(version: int) -> tuple:
            bar = progress_html(engine.training.progress()) if engine.training else gr.skip()
            if version == engine.version:
                return (bar, *[gr.skip()] * (3 + len(model_parts)))
            choices, current = run_choices(engine)
            return (bar, engine.version, header_markdown(engine), gr.update(choices=choices, value=current),
                    *model_tab_values(engine))

        timer.tick(refresh, seen, [train.progress, seen, header, selector, *model_parts], concurrency_id="tick",
                   concurrency_limit=None, show_progress="hidden", api_visibility="private")
        def switch(path: str | None) -> str:
            return _switch(engine, path)

        selector.input(switch, selector, switched, concurrency_id="model", api_visibility="private")
        if labelling is not None:  # a reopened page (or a restarted app) shows the last labelling where it stands
            demo.load(labelling.load, None, labelling.outputs, concurrency_id="label", api_visibility="private")
            demo.load(None, None, None, js=KEYS_JS)
    demo.queue(default_concurrency_limit=1, max_size=64)
    return demo


def launch(demo: Any, engine: Engine, host: str, port: int, block: bool = True) -> Any:
    """Serve ``demo`` on ``host:port``: no share link, no analytics or monitoring endpoints, no footer links out;
    only the runs' folders are served as files (where runs live, and the loaded run's), for the Model tab's link to
    a run's report. Returns the local URL."""
    gr = gradio()
    served = {engine.runs_home.resolve()}
    if engine.loaded is not None:
        served.add(Path(engine.loaded.path).resolve().parent)
    theme = gr.themes.Default(font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])
    _, url, _ = demo.launch(server_name=host, server_port=port, share=False, prevent_thread_lock=not block,
                            quiet=True, max_file_size=engine.max_upload_bytes, show_error=False,
                            allowed_paths=[str(p) for p in served], enable_monitoring=False,
                            footer_links=[], run_history=False, pwa=False, mcp_server=False, ssr_mode=False,
                            theme=theme, css=CSS + LABEL_CSS)
    return url


def wait_until_serving(url: str, timeout: float = 60.0, process: Any = None) -> float:
    """Seconds until ``url`` answers 200 (for scripts and tests that start the app in another process); raises
    TimeoutError after ``timeout``, or RuntimeError as soon as ``process`` (a Popen) has exited."""
    import urllib.request

    start = time.perf_counter()
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return time.perf_counter() - start
        except OSError:
            pass
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the app exited with status {process.returncode} before {url} answered")
        if time.perf_counter() - start > timeout:
            raise TimeoutError(f"{url} did not answer within {timeout:.0f} s")
        time.sleep(0.05)


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this computer (127.0.0.0/8, ::1, localhost)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False

