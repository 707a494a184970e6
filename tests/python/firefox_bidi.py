"""Drives Debian's firefox-esr (headless) over WebDriver BiDi, the WebSocket protocol Firefox
itself serves with --remote-debugging-port: no geckodriver (neither Debian nor PyPI ships a
Linux one) and nothing downloaded. Just what the playground's test needs: navigate, evaluate
script, take a screenshot, and collect console errors and requested URLs.

    with Firefox() as ff:
        ff.navigate(url); ff.wait_for("document.body.dataset.ready === 'true'")
"""

import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time

import websocket  # websocket-client, installed with selenium

from server_process import free_port

FIREFOX = shutil.which("firefox-esr") or shutil.which("firefox")
QUIET_PREFS = ['"app.update.enabled", false', '"browser.safebrowsing.malware.enabled", false',
               '"browser.safebrowsing.phishing.enabled", false',
               '"browser.safebrowsing.downloads.enabled", false',
               '"browser.shell.checkDefaultBrowser", false',
               '"browser.startup.homepage_override.mstone", "ignore"',
               '"datareporting.policy.dataSubmissionEnabled", false',
               '"extensions.update.enabled", false', '"network.captive-portal-service.enabled", false',
               '"network.connectivity-service.enabled", false', '"toolkit.telemetry.enabled", false',
               '"services.settings.server", "data:,"']


class Firefox:
    def __init__(self, timeout: float = 30.0):
        self.timeout = timeout
        self.ids = itertools.count(1)
        self.console_errors: list[str] = []
        self.urls: list[str] = []

    def __enter__(self) -> "Firefox":
        self.profile = tempfile.TemporaryDirectory(prefix="attnres-ff-")
        # The browser's own background traffic off: only the page under test makes requests.
        with open(f"{self.profile.name}/user.js", "w") as prefs:
            for pref in QUIET_PREFS:
                prefs.write(f"user_pref({pref});\n")
        port = free_port()
        self.proc = subprocess.Popen(
            [FIREFOX, "--headless", "--no-remote", "--profile", self.profile.name,
             "--remote-debugging-port", str(port), "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                # Firefox refuses a handshake that carries an Origin header.
                self.ws = websocket.create_connection(f"ws://127.0.0.1:{port}/session",
                                                      timeout=self.timeout, suppress_origin=True)
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.proc.kill()
                    raise
                time.sleep(0.2)
        self.command("session.new", {"capabilities": {}})
        self.command("session.subscribe", {"events": ["log.entryAdded",
                                                      "network.beforeRequestSent"]})
        self.context = self.command("browsingContext.getTree", {})["contexts"][0]["context"]
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.command("session.end", {})
        except Exception:  # the browser may already be gone; it is killed below anyway
            pass
        self.ws.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.profile.cleanup()

    def command(self, method: str, params: dict) -> dict:
        """Sends one command and returns its result, keeping the events that arrive meanwhile."""
        cid = next(self.ids)
        self.ws.send(json.dumps({"id": cid, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("type") == "event":
                self._event(message)
            elif message.get("id") == cid:
                if message["type"] == "error":
                    raise RuntimeError(f"{method}: {message['error']}: {message.get('message')}")
                return message["result"]

    def _event(self, message: dict) -> None:
        params = message["params"]
        if message["method"] == "log.entryAdded" and params.get("level") == "error":
            self.console_errors.append(params.get("text") or json.dumps(params))
        elif message["method"] == "network.beforeRequestSent":
            self.urls.append(params["request"]["url"])

    def navigate(self, url: str) -> None:
        self.command("browsingContext.navigate",
                     {"context": self.context, "url": url, "wait": "complete"})

    def evaluate(self, expression: str):
        """The value of a script expression (awaited), as plain JSON (it is JSON.stringify'd)."""
        result = self.command("script.evaluate", {
            "expression": f"(async () => JSON.stringify(await ({expression})))()",
            "target": {"context": self.context}, "awaitPromise": True})
        if result["type"] == "exception":
            raise RuntimeError(f"{expression}: {result['exceptionDetails']['text']}")
        value = result["result"].get("value")
        return None if value is None else json.loads(value)

    def wait_for(self, expression: str):
        deadline = time.monotonic() + self.timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression} stayed false for {self.timeout} s")
            time.sleep(0.1)

    def screenshot(self, path) -> None:
        data = self.command("browsingContext.captureScreenshot", {"context": self.context})["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
