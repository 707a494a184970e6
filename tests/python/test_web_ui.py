"""The web playground at / (server/http/ui/) in a real browser: Debian's Chromium, headless,
driven by Selenium through Debian's chromedriver (both from apt: docker/install-deps.sh --tests;
no driver or browser is downloaded, Selenium Manager never runs), against the real server.

What the page shows is read back from its DOM: the model card's fields, each streamed chunk
as a span of the answer, each heatmap cell's exact weight in data-value, the error box's text.
The heatmap, and a chat answer's tool calls (each call's data-name and data-arguments), are
compared with the API's own JSON for the same seeded request. A
screenshot of the page is kept under <build>/test-artifacts/. Firefox (firefox-esr, headless)
is checked by test_web_ui_firefox.py, the routes without a browser by test_web_ui_routes.py.
Skipped, with the reason, where Chromium is absent.
"""

import http.client
import json
import os
import shutil
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pytest

from checkpoint_cache import checkpoint_fixture
from http_helpers import post_json, request
from qwen3_checkpoint import CITY_TOOL as CITY
from qwen3_checkpoint import NOW_TOOL as NOW
from qwen3_checkpoint import make_qwen3_checkpoint
from server_process import ServerProcess

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                                reason="needs Debian's chromium and chromium-driver "
                                       "(docker/install-deps.sh --tests)")
webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (tests/requirements.txt)")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

WAIT = 30  # seconds a condition may take on a loaded 2-core machine before the test fails
KEY = "ui-test-key"


def make_chromium():
    os.environ["SE_OFFLINE"] = "true"  # belt and braces: Selenium Manager must not fetch anything
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,860", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    # An explicit driver path: Selenium uses it as given and does not look for one.
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


@pytest.fixture(scope="module")
def browser():
    driver = make_chromium()
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def server(attnres_bin):
    with ServerProcess(attnres_bin) as s:
        yield s


@pytest.fixture(scope="module")
def artifacts(build_dir) -> Path:
    path = build_dir / "test-artifacts"
    path.mkdir(parents=True, exist_ok=True)
    return path


# ---- page helpers ----

def open_page(driver, url):
    driver.get_log("browser")  # each page starts with empty logs
    driver.get_log("performance")
    driver.get(url + "/")


def wait_ready(driver):
    WebDriverWait(driver, WAIT).until(
        lambda d: d.execute_script("return document.body.dataset.ready") == "true")


def set_field(driver, element_id, value):
    driver.execute_script(
        "const e = document.getElementById(arguments[0]); e.value = arguments[1];"
        "e.dispatchEvent(new Event('change'));", element_id, str(value))


def settings(driver, **fields):
    for name, value in fields.items():
        set_field(driver, name.replace("_", "-"), value)


def send_prompt(driver, text):
    box = driver.find_element(By.ID, "prompt")
    box.clear()
    box.send_keys(text)
    driver.find_element(By.ID, "send").click()


def wait_idle_after_send(driver):
    """Waits until the request the page started has ended (answer complete or refused)."""
    WebDriverWait(driver, WAIT).until(
        lambda d: d.execute_script("return document.body.dataset.state") == "idle")


def last_answer(driver):
    """(text, number of streamed chunk spans, finish reason) of the newest answer."""
    return driver.execute_script("""
        const m = [...document.querySelectorAll('.msg.assistant, .msg.completion')].pop();
        return [m.querySelector('.text').textContent, m.querySelectorAll('.text span').length,
                m.dataset.finish || null];""")


def heatmap(driver):
    """The heatmap as shown: (step, row labels, column labels, cell values; None = unused)."""
    return driver.execute_script("""
        const t = document.getElementById('heatmap');
        const cols = [...t.querySelectorAll('thead th.source')].map((th) => th.textContent);
        const rows = [...t.tBodies[0].rows].map((tr) => tr.cells[0].textContent);
        const cells = [...t.tBodies[0].rows].map((tr) => [...tr.querySelectorAll('td')].map(
            (td) => td.dataset.value === '' ? null : Number(td.dataset.value)));
        return [t.dataset.step, rows, cols, cells];""")


def console_errors(driver):
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def requested_urls(driver):
    """Every URL the page asked for: the DevTools network log plus the page's resource timing."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    urls += driver.execute_script(
        "return performance.getEntriesByType('resource').map((e) => e.name)")
    return urls


def error_text(driver):
    box = driver.find_element(By.ID, "error")
    return None if box.get_attribute("hidden") is not None else box.text


# ---- tests ----

def test_page_loads_with_the_model_card_no_console_errors_and_no_outside_requests(server, browser):
    open_page(browser, server.http_url)
    wait_ready(browser)
    card = {dd.get_attribute("data-field"): dd.text
            for dd in browser.find_elements(By.CSS_SELECTOR, "#card dd")}
    info = json.loads(request(server.http_url, "GET", "/ui/model-info")[2])
    assert card["model"] == "attnres-demo"
    assert card["AttnRes"] == f"block, {info['attnres_num_blocks']} blocks, gate bias"
    assert card["context"] == str(info["max_model_len"]) and card["dtype"] == "BF16"
    assert card["device"] == info["device"] and info["device"]
    # The glance fills from /metrics.
    WebDriverWait(browser, WAIT).until(lambda d: d.find_element(By.ID, "g-running").text != "–")
    assert console_errors(browser) == []
    urls = requested_urls(browser)
    assert any(u.endswith("/ui/app.js") for u in urls) and any(u.endswith("/metrics") for u in urls)
    origin = server.http_url + "/"
    outside = [u for u in urls if not (u.startswith(origin) or u.startswith("data:"))]
    assert outside == [], outside


def test_streamed_completion_and_heatmap_equal_the_api(server, browser, artifacts):
    open_page(browser, server.http_url)
    wait_ready(browser)
    settings(browser, mode="completion", temperature=0, seed=7, max_tokens=6, top_p=1, top_k=-1)
    prompt = "Depth attention shows"
    send_prompt(browser, prompt)
    wait_idle_after_send(browser)
    text, spans, finish = last_answer(browser)
    assert error_text(browser) is None
    assert finish == "length" and spans > 1  # several SSE chunks, each rendered as it came

    status, _, api = post_json(server.http_url, "/v1/completions", {
        "model": "attnres-demo", "prompt": prompt, "max_tokens": 6, "temperature": 0, "seed": 7,
        "top_p": 1, "top_k": -1, "return_depth_attention": True, "depth_attention_per_token": True})
    assert status == 200, api
    choice = api["choices"][0]
    assert text == choice["text"]
    depth = choice["depth_attention"]

    buttons = browser.find_elements(By.CSS_SELECTOR, "#depth-tokens button")
    assert [b.get_attribute("data-step") for b in buttons] == \
        ["prompt"] + [str(i) for i in range(len(depth["per_token"]))]
    expected = [("prompt", depth["prompt_mean"])] + \
        [(str(i), m) for i, m in enumerate(depth["per_token"])]
    for step, matrix in expected:
        browser.find_element(By.CSS_SELECTOR, f'#depth-tokens button[data-step="{step}"]').click()
        shown_step, rows, cols, cells = heatmap(browser)
        assert shown_step == step
        assert rows == depth["sublayers"] and cols == depth["sources"]
        assert cells == matrix, step  # the exact numbers, unused cells included
    # Hovering a piece of the answer shows the token that produced it; ← / → step.
    span = browser.find_elements(By.CSS_SELECTOR, ".msg.completion .text span[data-token]")[2]
    ActionChains(browser).move_to_element(span).perform()
    assert heatmap(browser)[0] == span.get_attribute("data-token")
    browser.find_element(By.TAG_NAME, "body").send_keys(Keys.ARROW_LEFT)
    assert heatmap(browser)[0] == str(int(span.get_attribute("data-token")) - 1)
    assert heatmap(browser)[3] == depth["per_token"][int(span.get_attribute("data-token")) - 1]
    browser.save_screenshot(str(artifacts / "web_ui_chromium.png"))
    assert console_errors(browser) == []


def test_chat_streams_then_stop_and_regenerate(server, browser):
    open_page(browser, server.http_url)
    wait_ready(browser)
    settings(browser, mode="chat", temperature=0, seed=1, max_tokens=5, system="Be brief.")
    send_prompt(browser, "Hello there")
    wait_idle_after_send(browser)
    first, spans, finish = last_answer(browser)
    assert spans >= 1 and finish == "length"
    # The same conversation through the API, with the system prompt the page sends.
    status, _, api = post_json(server.http_url, "/v1/chat/completions", {
        "model": "attnres-demo", "temperature": 0, "seed": 1, "max_tokens": 5,
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "Hello there"}]})
    assert status == 200 and api["choices"][0]["message"]["content"] == first
    # Copy puts the answer on the clipboard.
    browser.execute_cdp_cmd("Browser.grantPermissions", {
        "origin": server.http_url, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]})
    browser.find_elements(By.CSS_SELECTOR, ".msg.assistant .copy")[-1].click()
    WebDriverWait(browser, WAIT).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant .copy")[-1].text == "Copied")
    assert browser.execute_async_script(
        "navigator.clipboard.readText().then(arguments[0], (e) => arguments[0](String(e)))") == first
    # Regenerate (greedy): the same answer again, in the same message.
    browser.find_elements(By.CSS_SELECTOR, ".msg.assistant .regenerate")[-1].click()
    wait_idle_after_send(browser)
    assert last_answer(browser)[0] == first
    assert len(browser.find_elements(By.CSS_SELECTOR, ".msg.assistant")) == 1
    # Stop: a long answer ends without a finish reason, and the server drops the request.
    settings(browser, max_tokens=20000)
    send_prompt(browser, "Tell me everything")
    WebDriverWait(browser, WAIT).until(lambda d: last_answer(d)[1] >= 1)
    browser.find_element(By.ID, "stop-button").click()
    wait_idle_after_send(browser)
    assert last_answer(browser)[2] is None and error_text(browser) is None
    WebDriverWait(browser, WAIT).until(
        lambda d: server.metrics()["attnres:num_requests_running"] == 0)
    assert console_errors(browser) == []


def test_refusal_shows_the_servers_400_message(server, browser):
    open_page(browser, server.http_url)
    wait_ready(browser)
    settings(browser, mode="completion", temperature=-1, max_tokens=4)
    send_prompt(browser, "Hi")
    wait_idle_after_send(browser)
    status, _, api = post_json(server.http_url, "/v1/completions",
                               {"prompt": "Hi", "temperature": -1, "max_tokens": 4})
    assert status == 400
    shown = error_text(browser)
    assert shown == "The server refused the request (400): " + api["error"]["message"]
    assert "temperature" in shown
    # The refused prompt is back in the input box, the conversation as it was.
    assert browser.find_element(By.ID, "prompt").get_attribute("value") == "Hi"
    assert browser.find_elements(By.CSS_SELECTOR, ".msg") == []


class HeldStreams:
    """`n` long streamed completions held open (each read up to its first event, so it is in
    the engine), closed on exit: the server aborts what a gone client asked for."""

    def __init__(self, url, n, first_event=True):
        self.url, self.n, self.first_event = url, n, first_event
        self.conns = []

    def __enter__(self):
        u = urlparse(self.url)
        body = json.dumps({"prompt": "Busy", "max_tokens": 20000, "ignore_eos": True,
                           "stream": True})

        def open_one(i):
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
            conn.request("POST", "/v1/completions", body=body,
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            assert resp.status == 200
            if self.first_event:
                resp.fp.readline()
            return conn

        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(self.n) as pool:
            self.conns = list(pool.map(open_one, range(self.n)))
        return self

    def __exit__(self, *exc):
        for conn in self.conns:
            conn.sock.shutdown(socket.SHUT_RDWR)
            conn.close()


def test_page_stays_usable_during_8_concurrent_streams(server, browser):
    open_page(browser, server.http_url)
    wait_ready(browser)
    settings(browser, mode="completion", temperature=0, max_tokens=4)
    with HeldStreams(server.http_url, 8):
        # The glance shows the load, and the page's own request streams its answer beside it.
        WebDriverWait(browser, WAIT).until(
            lambda d: d.find_element(By.ID, "g-running").text in ("8", "9"))
        send_prompt(browser, "Still answering?")
        wait_idle_after_send(browser)
        text, spans, finish = last_answer(browser)
        assert finish == "length" and spans >= 1 and error_text(browser) is None
        assert float(browser.find_element(By.ID, "g-tps").text) >= 0


def test_queue_full_503_message(attnres_bin, browser):
    with ServerProcess(attnres_bin, "--max-num-seqs", "1", "--max-queued-requests", "1") as s:
        open_page(browser, s.http_url)
        wait_ready(browser)
        settings(browser, mode="completion", max_tokens=4)
        with HeldStreams(s.http_url, 1), HeldStreams(s.http_url, 1, first_event=False):
            send_prompt(browser, "Hi")
            wait_idle_after_send(browser)
            shown = error_text(browser)
        assert shown.startswith("The server is busy or unavailable (503): ")
        assert "Retry after 1 s." in shown
        assert browser.find_element(By.ID, "error").get_attribute("data-status") == "503"
        # Once the server has room, sending the prompt the page kept succeeds.
        WebDriverWait(browser, WAIT).until(
            lambda d: s.metrics()["attnres:num_requests_running"] == 0
            and s.metrics()["attnres:num_requests_waiting"] == 0)
        assert browser.find_element(By.ID, "prompt").get_attribute("value") == "Hi"
        browser.find_element(By.ID, "send").click()
        wait_idle_after_send(browser)
        assert last_answer(browser)[2] == "length" and error_text(browser) is None


def test_api_key_page_asks_for_the_key(attnres_bin, browser):
    with ServerProcess(attnres_bin, "--api-key", KEY) as s:
        browser.execute_script("sessionStorage.clear()")
        open_page(browser, s.http_url)
        form = browser.find_element(By.ID, "key-form")
        WebDriverWait(browser, WAIT).until(lambda d: form.get_attribute("hidden") is None)
        key = browser.find_element(By.ID, "api-key")
        key.send_keys(KEY)
        form.find_element(By.CSS_SELECTOR, "button").click()
        wait_ready(browser)
        assert form.get_attribute("hidden") is not None and error_text(browser) is None
        settings(browser, mode="completion", temperature=0, max_tokens=3)
        send_prompt(browser, "With a key")
        wait_idle_after_send(browser)
        assert last_answer(browser)[2] == "length" and error_text(browser) is None
        # The only errors the console saw are the key-less requests' 401s.
        errors = console_errors(browser)
        assert all("401" in e["message"] for e in errors), errors
        browser.execute_script("sessionStorage.clear()")


@pytest.fixture(scope="module")
def checkpoint(ckpt_root):
    yield from checkpoint_fixture(ckpt_root, prefix="webui", seed=4)


def test_plain_model_page_says_it_has_no_depth_attention(attnres_bin, browser, checkpoint):
    with ServerProcess(attnres_bin, "--model", checkpoint("qwen3")) as s:
        open_page(browser, s.http_url)
        wait_ready(browser)
        assert "no depth attention" in browser.find_element(By.ID, "depth-note").text
        assert browser.find_element(By.ID, "depth").get_attribute("disabled") is not None
        card = {dd.get_attribute("data-field"): dd.text
                for dd in browser.find_elements(By.CSS_SELECTOR, "#card dd")}
        assert card["AttnRes"] == "none (plain model)"
        # It asks for no weights, so the request the plain model would refuse is never sent.
        settings(browser, mode="completion", temperature=0, max_tokens=3)
        send_prompt(browser, "Plain")
        wait_idle_after_send(browser)
        assert last_answer(browser)[2] == "length" and error_text(browser) is None
        assert browser.find_elements(By.CSS_SELECTOR, "#heatmap td") == []


# ---- tool calls and reasoning, on a checkpoint with the real Qwen3 tokenizer and template ----

def shown_answer(driver):
    """The newest chat answer's parts as the page shows them."""
    return driver.execute_script("""
        const m = [...document.querySelectorAll('.msg.assistant')].pop();
        const reasoning = m.querySelector('.reasoning');
        const note = m.querySelector('.finish');
        return {
          text: m.querySelector('.text').textContent,
          reasoning: reasoning.hidden ? null : m.querySelector('.reasoning-text').textContent,
          calls: [...m.querySelectorAll('.tool-call')].map((c) => ({
            id: c.dataset.id, name: c.dataset.name, arguments: c.dataset.arguments,
            shown_name: c.querySelector('.call-head code').textContent,
            shown_arguments: c.querySelector('.call-args').textContent})),
          finish: m.dataset.finish || null,
          finish_note: note.hidden ? null : note.textContent};""")


def pretty(arguments):
    """The arguments as the page prints them (JSON.stringify's two-space layout)."""
    return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)


@pytest.fixture(scope="module")
def qwen3_model(ckpt_root):
    path = make_qwen3_checkpoint(ckpt_root / "webui_qwen3", seed=5)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_forced_tool_call_shown_as_the_api_returns_it(attnres_bin, browser, qwen3_model):
    with ServerProcess(attnres_bin, "--model", qwen3_model, "--max-model-len", "4096") as s:
        open_page(browser, s.http_url)
        wait_ready(browser)
        settings(browser, mode="chat", temperature=0, seed=3, max_tokens=150,
                 tools=json.dumps([CITY, NOW]), tool_choice="required")
        # Thinking off (the call is forced from the answer's first token on), one call.
        browser.find_element(By.ID, "thinking").click()
        browser.find_element(By.ID, "parallel-tools").click()
        send_prompt(browser, "Weather in Oslo for 2 days?")
        wait_idle_after_send(browser)
        assert error_text(browser) is None
        shown = shown_answer(browser)

        model = json.loads(request(s.http_url, "GET", "/v1/models")[2])["data"][0]["id"]
        status, _, api = post_json(s.http_url, "/v1/chat/completions", {
            "model": model, "temperature": 0, "seed": 3, "max_tokens": 150,
            "messages": [{"role": "user", "content": "Weather in Oslo for 2 days?"}],
            "tools": [CITY, NOW], "tool_choice": "required", "parallel_tool_calls": False,
            "chat_template_kwargs": {"enable_thinking": False}})
        assert status == 200, api
        choice = api["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        calls = choice["message"]["tool_calls"]
        assert len(calls) == 1
        assert [(c["name"], c["arguments"]) for c in shown["calls"]] == \
            [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
        call = shown["calls"][0]
        assert call["id"].startswith("call_")
        assert call["shown_name"] == call["name"]
        assert call["shown_arguments"] == pretty(call["arguments"])
        assert shown["finish"] == "tool_calls"
        assert shown["finish_note"] == "finish_reason: tool_calls"
        assert shown["reasoning"] is None and shown["text"] == ""
        assert console_errors(browser) == []


# A reply a trained Qwen3 would write, forced by ATTNRES_TEST_SCRIPTED_REPLY
# (server/cli/scripted_reply_runner.h): the server parses it as it would the model's own.
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}},
                   "required": ["city"]}}}
SCRIPT_CALLS = [("get_weather", '{"city": "Zürich", "days": 2}'), ("now", "{}")]
SCRIPT_REASONING = "\nThe user wants the weather ☀.\n"
SCRIPT_TEXT = (f"<think>{SCRIPT_REASONING}</think>\n\nLet me check.\n" + "\n".join(
    f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'
    for name, arguments in SCRIPT_CALLS))


def test_reasoning_and_tool_calls_of_a_scripted_reply(attnres_bin, browser, qwen3_model,
                                                      artifacts):
    with ServerProcess(attnres_bin, "--model", qwen3_model, "--max-model-len", "4096",
                       env={"ATTNRES_TEST_SCRIPTED_REPLY": SCRIPT_TEXT + "<|im_end|>"}) as s:
        open_page(browser, s.http_url)
        wait_ready(browser)
        settings(browser, mode="chat", temperature=0.7, seed=1, max_tokens=200,
                 tools=json.dumps([WEATHER, NOW]))
        send_prompt(browser, "Weather?")
        wait_idle_after_send(browser)
        assert error_text(browser) is None
        shown = shown_answer(browser)
        # The calls assembled from the streamed fragments, the reasoning above the text.
        assert shown["reasoning"] == SCRIPT_REASONING
        assert shown["text"] == "\n\nLet me check."
        assert [(c["name"], c["arguments"]) for c in shown["calls"]] == SCRIPT_CALLS
        assert [c["shown_arguments"] for c in shown["calls"]] == \
            ['{\n  "city": "Zürich",\n  "days": 2\n}', "{}"]
        assert shown["finish_note"] == "finish_reason: tool_calls"
        assert browser.execute_script(
            "const m = document.querySelector('.msg.assistant');"
            "return [...m.children].map((c) => c.className);")[:4] == \
            ["who", "reasoning", "text", "tool-calls"]
        browser.save_screenshot(str(artifacts / "web_ui_tool_calls_chromium.png"))
        # The next turn sends the calls back in the history; without tools nothing is parsed
        # as a call, the thinking is still split off.
        settings(browser, tools="")
        send_prompt(browser, "And without tools?")
        wait_idle_after_send(browser)
        assert error_text(browser) is None
        shown = shown_answer(browser)
        assert shown["reasoning"] == SCRIPT_REASONING
        assert shown["text"] == SCRIPT_TEXT.split("</think>")[1]
        assert shown["calls"] == [] and shown["finish"] == "stop" and shown["finish_note"] is None
        assert console_errors(browser) == []


def test_tools_field_with_bad_json_sends_nothing(server, browser):
    open_page(browser, server.http_url)
    wait_ready(browser)
    settings(browser, mode="chat", max_tokens=3, tools="[{not json")
    send_prompt(browser, "Hi")
    wait_idle_after_send(browser)
    shown = error_text(browser)
    assert shown.startswith("Tools: not valid JSON (") and shown.endswith(". Nothing was sent.")
    settings(browser, tools='{"type": "function"}')
    browser.find_element(By.ID, "send").click()
    wait_idle_after_send(browser)
    assert error_text(browser) == \
        "Tools: must be a JSON list of tool definitions. Nothing was sent."
    assert browser.find_element(By.ID, "prompt").get_attribute("value") == "Hi"
    assert browser.find_elements(By.CSS_SELECTOR, ".msg") == []
    assert not [u for u in requested_urls(browser) if "/v1/chat/completions" in u]
    # tool_choice "required" with no tools: the server's 400, shown as other refusals are.
    settings(browser, tools="", tool_choice="required")
    browser.find_element(By.ID, "send").click()
    wait_idle_after_send(browser)
    status, _, api = post_json(server.http_url, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
        "tool_choice": "required"})
    assert status == 400 and api["error"]["param"] == "tool_choice"
    assert error_text(browser) == "The server refused the request (400): " + api["error"]["message"]
    assert browser.find_elements(By.CSS_SELECTOR, ".msg") == []


# ---- structured output: the response format field ----

SHAPE = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                          "size": {"enum": [1, 2, 3]}},
         "required": ["color", "size"], "additionalProperties": False}


def shown_json(driver):
    """(data-json, the label, the pretty-printed JSON or None, the raw text) of the newest
    answer."""
    return driver.execute_script("""
        const m = [...document.querySelectorAll('.msg.assistant, .msg.completion')].pop();
        const pre = m.querySelector('.json-answer pre');
        return [m.dataset.json || null, m.querySelector('.json-label').textContent,
                pre ? pre.textContent : null, m.querySelector('.text').textContent];""")


def test_response_format_answer_is_shown_as_json(server, browser):
    open_page(browser, server.http_url)
    wait_ready(browser)
    settings(browser, mode="chat", temperature=0, seed=2, max_tokens=40,
             response_format=json.dumps(SHAPE))
    send_prompt(browser, "A thing?")
    wait_idle_after_send(browser)
    assert error_text(browser) is None
    marked, label, pretty_text, raw = shown_json(browser)
    status, _, api = post_json(server.http_url, "/v1/chat/completions", {
        "model": "attnres-demo", "temperature": 0, "seed": 2, "max_tokens": 40,
        "messages": [{"role": "user", "content": "A thing?"}],
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "answer", "schema": SHAPE}}})
    assert status == 200, api
    content = api["choices"][0]["message"]["content"]
    assert api["choices"][0]["finish_reason"] == "stop"
    assert raw == content and json.loads(content)["color"] in ("red", "green", "blue")
    assert marked == "valid" and label == "JSON (response_format json_schema)"
    assert pretty_text == json.dumps(json.loads(content), indent=2)
    # Cut short by max_tokens, the answer is marked as not whole JSON.
    settings(browser, max_tokens=2)
    send_prompt(browser, "Another?")
    wait_idle_after_send(browser)
    marked, label, pretty_text, _ = shown_json(browser)
    assert last_answer(browser)[2] == "length"
    assert marked == "invalid" and pretty_text is None
    assert label == "Not whole JSON (response_format json_schema)"
    # A schema the page cannot parse: named, nothing sent; one the server refuses: its 400.
    settings(browser, response_format="{")
    send_prompt(browser, "Bad")
    assert error_text(browser).startswith("Response format: not valid JSON (")
    assert len(browser.find_elements(By.CSS_SELECTOR, ".msg.assistant")) == 2
    bad = {"type": "object", "not": {"type": "object"}}
    settings(browser, response_format=json.dumps(bad))
    browser.find_element(By.ID, "send").click()
    wait_idle_after_send(browser)
    status, _, api = post_json(server.http_url, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Bad"}], "max_tokens": 3,
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer",
                                                                    "schema": bad}}})
    assert status == 400, api
    assert error_text(browser) == "The server refused the request (400): " + api["error"]["message"]
    # The only errors the console saw are the refused request's.
    errors = console_errors(browser)
    assert all("status of 400" in e["message"] for e in errors), errors
