"""The web playground in Debian's firefox-esr, headless, over WebDriver BiDi (firefox_bidi.py):
the page loads with no console error and no request leaving 127.0.0.1, a greedy completion
streams, and the heatmap's cells equal the API's weights for the same request, as in Chromium
(test_web_ui.py). Skipped, with the reason, where firefox-esr is absent."""

import json

import pytest

from firefox_bidi import FIREFOX
from http_helpers import post_json
from server_process import ServerProcess

pytestmark = pytest.mark.skipif(not FIREFOX, reason="needs Debian's firefox-esr "
                                                    "(docker/install-deps.sh --tests)")
pytest.importorskip("websocket", reason="needs websocket-client (installed with selenium)")

READ_HEATMAP = """(() => {
  const t = document.getElementById('heatmap');
  return [t.dataset.step, [...t.tBodies[0].rows].map((tr) => [...tr.querySelectorAll('td')]
      .map((td) => td.dataset.value === '' ? null : Number(td.dataset.value)))];
})()"""


def test_page_streams_and_shows_the_apis_weights_in_firefox(attnres_bin, build_dir):
    from firefox_bidi import Firefox
    prompt = "Firefox reads"
    with ServerProcess(attnres_bin) as server, Firefox() as ff:
        ff.navigate(server.http_url + "/")
        ff.wait_for("document.body.dataset.ready === 'true'")
        assert ff.evaluate("document.querySelector('#card dd').textContent") == "attnres-demo"
        ff.evaluate(f"""(() => {{
            const set = (id, v) => {{ document.getElementById(id).value = v; }};
            set('mode', 'completion'); set('temperature', '0'); set('seed', '3');
            set('max-tokens', '5'); set('prompt', {json.dumps(prompt)});
            document.getElementById('mode').dispatchEvent(new Event('change'));
            document.getElementById('send').click();
            return true; }})()""")
        ff.wait_for("document.body.dataset.state === 'idle' && "
                    "document.querySelector('.msg.completion')?.dataset.finish === 'length'")
        text, spans = ff.evaluate("[document.querySelector('.msg.completion .text').textContent,"
                                  " document.querySelectorAll('.msg.completion .text span').length]")
        status, _, api = post_json(server.http_url, "/v1/completions", {
            "prompt": prompt, "max_tokens": 5, "temperature": 0, "seed": 3,
            "return_depth_attention": True, "depth_attention_per_token": True})
        assert status == 200, api
        choice = api["choices"][0]
        assert text == choice["text"] and spans > 1
        depth = choice["depth_attention"]
        expected = [("prompt", depth["prompt_mean"])] + \
            [(str(i), m) for i, m in enumerate(depth["per_token"])]
        for step, matrix in expected:
            ff.evaluate(f"document.querySelector('#depth-tokens button[data-step=\"{step}\"]')"
                        ".click() || true")
            assert ff.evaluate(READ_HEATMAP) == [step, matrix]
        artifacts = build_dir / "test-artifacts"
        artifacts.mkdir(parents=True, exist_ok=True)
        ff.screenshot(artifacts / "web_ui_firefox.png")
        assert ff.evaluate("document.getElementById('error').hidden") is True
        # Events that arrived after the last command are read by this one.
        ff.evaluate("true")
        assert ff.console_errors == []
        assert ff.urls and all(u.startswith(server.http_url + "/") or u.startswith("data:")
                               for u in ff.urls), ff.urls
