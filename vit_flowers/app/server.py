"""The web app's Gradio page: its tabs laid out over :mod:`~vit_flowers.app.engine` and
:mod:`~vit_flowers.app.page`, and serving it."""

from __future__ import annotations

import ipaddress
import logging
import os
import time
from pathlib import Path
from typing import Any

from ..data.images import ImageLoadError, load_image
from ..runs import folders as runs
from ..runs.errors import CheckpointError
from .engine import FOLDER_COLUMNS, Engine, Taught, model_card, teach_class
from .page import CSS, classify_html, classify_page, folder_page, model_card_markdown

__all__ = ["gradio", "header_markdown", "taught_markdown", "build_page", "launch", "is_loopback", "wait_until_serving"]

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


def _model_tab(gr: Any, engine: Engine) -> None:
    card = model_card(engine.loaded)
    url = f"gradio_api/file={card.report.resolve()}" if card.report else None
    gr.Markdown(model_card_markdown(card, url), elem_id="vf-model-card")
    with gr.Row():
        for path, label in ((card.confusion, "confusion matrix (validation)"), (card.curves, "training curves")):
            try:
                figure = load_image(path) if path is not None else None
            except ImageLoadError as exc:  # a damaged figure costs its own panel, not the page
                logger.warning("%s", exc)
                continue
            if figure is not None:
                with gr.Column():  # the caption above the figure: Gradio's own label would cover its top corner
                    gr.Markdown(f"**{label.capitalize()}**")
                    gr.Image(value=figure, label=label, show_label=False, interactive=False,
                             buttons=["download", "fullscreen"])  # no "share" (to Hugging Face)


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
    """The page's header: what the loaded model knows (shown again after teaching)."""
    return (f"## vit_flowers: which flower is it?\nThe model knows {len(engine.classes)} classes: "
            f"{', '.join(engine.classes)}.")


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


def build_page(engine: Engine, folders: bool = True) -> Any:
    """The Gradio page (Blocks, queued one model call at a time). ``folders``: build the Folder tab at all
    (off, it does not exist on the server: no request can reach it).

    The functions behind each tab (:func:`classify_files`, :func:`predict_folder`, :func:`model_card` and their
    ``*_html`` renderers) work without Gradio; this only lays them out. Every output has a label: the name the
    API gives it (shown or not)."""
    gr = gradio()
    with gr.Blocks(title="vit_flowers", analytics_enabled=False, delete_cache=(3600, 3600)) as demo:
        header = gr.Markdown(header_markdown(engine), label="header", elem_id="vf-header")
        with gr.Tab("Classify"):
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
        if folders:
            with gr.Tab("Folder"):
                _folder_tab(gr, engine)
        with gr.Tab("Teach"):
            _teach_tab(gr, engine, header)
        with gr.Tab("Model"):
            _model_tab(gr, engine)
    demo.queue(default_concurrency_limit=1, max_size=64)
    return demo


def launch(demo: Any, engine: Engine, host: str, port: int, block: bool = True) -> Any:
    """Serve ``demo`` on ``host:port``: no share link, no analytics or monitoring endpoints, no footer links out;
    only the run's ``report/`` folder is served as files. Returns the local URL."""
    gr = gradio()
    card_dir = Path(engine.loaded.path).resolve().parent / runs.REPORT
    theme = gr.themes.Default(font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])
    _, url, _ = demo.launch(server_name=host, server_port=port, share=False, prevent_thread_lock=not block,
                            quiet=True, max_file_size=engine.max_upload_bytes, show_error=False,
                            allowed_paths=[str(card_dir)] if card_dir.is_dir() else None, enable_monitoring=False,
                            footer_links=[], run_history=False, pwa=False, mcp_server=False, ssr_mode=False,
                            theme=theme, css=CSS)
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

