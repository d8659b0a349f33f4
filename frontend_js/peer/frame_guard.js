// A classic script (not a module), served in the page's <head> ahead of Gradio's own modules by
// daisy/space/server.py (GradioFrameGuard), so it runs before they take their requestAnimationFrame.
// Gradio's app loader (gradio 6.31: a StatusTracker around the whole app) starts a
// requestAnimationFrame timer while the page loads and never stops it once the loader is gone:
// a frame at every vsync for as long as the tab is open, ~40 ms of CPU per second on this
// machine's pages (main thread, compositor, GPU process), taken from training
// (TEST_RESULTS.md "Where a group step's CPU goes"). Once the peer panel is mounted, requests
// from Gradio's status-tracker module are not passed on: the loop ends at its next frame. Any
// other status timer of Gradio then stops too (its elapsed-seconds text; the page's one Python
// event, the data line on load, shows none).
(() => {
  const request = window.requestAnimationFrame.bind(window);
  const fromStatusTracker = () => /\/statustracker-[^/]*\.js/.test(new Error().stack || '');
  window.requestAnimationFrame = (callback) =>
    (document.getElementById('daisy-peer') && fromStatusTracker() ? 0 : request(callback));
})();
