"""The Space idles quietly: Gradio's queue, which by default polls for work every 1 ms and for
progress every 10 ms, looks every QUEUE_IDLE_POLL_S instead (daisy/space/server.py; the CPU it
saves: TEST_RESULTS.md "Where a group step's CPU goes"). The attributes are Gradio's own, so the
test also checks that Gradio's queue loops still read them: an upgrade that renames one fails
here, not silently."""
import inspect

from gradio import queueing
from gradio.routes import App
from starlette.routing import Mount

from daisy.space.server import QUEUE_IDLE_POLL_S, create_app


class NoData:
    """A data source that is never asked (the page's data line runs only on a page load)."""

    def info(self):
        raise AssertionError("not asked")


def test_the_page_queue_polls_every_50_ms_when_idle():
    assert "self.sleep_when_free" in inspect.getsource(queueing.Queue.start_processing)
    assert "self.progress_update_sleep_when_free" in inspect.getsource(queueing.Queue.start_progress_updates)
    app = create_app(data_source=NoData())
    gradio_apps = [r.app for r in app.routes if isinstance(r, Mount) and isinstance(r.app, App)]
    assert len(gradio_apps) == 1, app.routes
    queue = gradio_apps[0].get_blocks()._queue
    assert queue.sleep_when_free == queue.progress_update_sleep_when_free == QUEUE_IDLE_POLL_S == 0.05
