"""envkit view: the HTML page of an episodes file — its builder, its escaping, the CLI, and the page in headless
Chromium (its script run, filters from the URL applied, a screenshot taken)."""

from __future__ import annotations

import base64
import copy
import fnmatch
import hashlib
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

import envkit
from envkit.cli.app import main
from envkit.cli.view import build_html, decode_tokens, embed_json, normalize_episode, read_episodes, write_view
from envkit.demos import oracle_episodes

XSS = '<script>document.body.setAttribute("data-pwned", "1")</script><img src=x onerror="document.title=1">'
"""Episode text that would run as code if the page ever parsed episode content as HTML."""


@pytest.fixture(scope="module")
def eval_file(tiny_model_dir, tmp_path_factory) -> Path:
    """Real `envkit eval --out` records: the tiny model on arithmetic (score 0, no tool calls)."""
    out = tmp_path_factory.mktemp("eval") / "episodes.jsonl"
    argv = ["eval", "arithmetic", "--model", str(tiny_model_dir), "--tasks", "2", "--samples", "2"]
    assert main([*argv, "--max-new-tokens", "8", "--max-turns", "1", "--out", str(out), "--json"]) == 0
    return out


@pytest.fixture(scope="module")
def oracle_records(local_tokenizer) -> list[dict]:
    """Oracle episodes of arithmetic (score 1, two tool calls each) as the JSON lines eval writes."""
    episodes = oracle_episodes(lambda: envkit.make("arithmetic"), local_tokenizer, [0, 1, 2])
    return [json.loads(e.to_json()) for e in episodes]


@pytest.fixture()
def episodes_file(eval_file, oracle_records, tmp_path) -> Path:
    """Oracle episodes, then the model's, then one with hostile text everywhere and an error."""
    hostile = copy.deepcopy(oracle_records[0])
    hostile["messages"][1]["content"] = XSS
    hostile["messages"][2]["tool_calls"][0]["function"]["arguments"] = {"expression": "</script>" + XSS}
    hostile["messages"][3]["name"] = XSS
    hostile.update(score=0.0, finish_reason="error", error="step raised: " + XSS, info={XSS: XSS})
    path = tmp_path / "episodes.jsonl"
    lines = [json.dumps(r) for r in oracle_records] + eval_file.read_text().splitlines() + [json.dumps(hostile)]
    path.write_text("\n".join(lines) + "\n")
    return path


def page_data(page: str) -> dict:
    """The JSON the page embeds (parsed strictly: NaN or Infinity would fail)."""
    match = re.search(r'<script type="application/json" id="episodes-data">(.*?)</script>', page, re.S)
    assert match, "no data block"

    def no_constants(name: str) -> None:
        raise AssertionError(f"{name} in the embedded JSON")

    return json.loads(match.group(1), parse_constant=no_constants)


def test_read_episodes_normalises_real_eval_records(eval_file):
    episodes = read_episodes(eval_file)
    assert len(episodes) == 4
    for episode in episodes:
        assert episode["messages"][0]["role"] == "system" and episode["finish_reason"]
        assert len(episode["completion_ids"]) == len(episode["env_mask"]) == len(episode["logprobs"]) > 0
        assert isinstance(episode["score"], float) and episode["error"] is None


def test_normalize_episode_keeps_odd_values_showable():
    episode = normalize_episode(
        {"messages": ["not a dict"], "score": float("nan"), "logprobs": [float("-inf"), -0.5], "env_mask": [1, "x"]}
    )
    assert episode["messages"] == [{"role": "?", "content": '"not a dict"'}]
    assert episode["score"] == "nan" and episode["logprobs"] == ["-inf", -0.5]
    assert episode["env_mask"] == [] and episode["completion_ids"] == [] and episode["error"] is None
    embed_json(episode)  # no NaN left: JSON can carry it


def test_the_page_is_self_contained_and_pins_its_script_and_style(oracle_records):
    page = build_html([normalize_episode(r) for r in oracle_records])
    assert not re.search(r"\b(src|href)\s*=|https?:|url\(|@import", page) and "<link" not in page
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page).group(1)
    assert "default-src &#x27;none&#x27;" in csp
    hashes = re.findall(r"sha256-([A-Za-z0-9+/=]+)", csp)
    style = re.search(r"<style>(.*?)</style>", page, re.S).group(1)
    script = re.findall(r"<script>(.*?)</script>", page, re.S)
    assert len(script) == 1
    for inline in (script[0], style):
        assert base64.b64encode(hashlib.sha256(inline.encode()).digest()).decode() in hashes


def test_episode_text_cannot_inject_html(episodes_file):
    episodes = read_episodes(episodes_file)
    page = build_html(episodes, title=XSS)
    assert page.count("<script") == 2 and page.count("</script>") == 2  # the data block and the page's own code
    assert "<img" not in page
    assert "&lt;script&gt;" in page.split("<body>")[0]  # the title, escaped
    data = page_data(page)
    hostile = data["episodes"][-1]
    assert hostile["messages"][1]["content"] == XSS and hostile["error"] == "step raised: " + XSS
    assert hostile["messages"][2]["tool_calls"][0]["function"]["arguments"]["expression"] == "</script>" + XSS


def test_prompts_are_stored_once_per_group_and_tokens_decoded_one_by_one(eval_file, local_tokenizer):
    episodes = read_episodes(eval_file)
    ids = [t for e in episodes for t in e["completion_ids"]]
    vocab = decode_tokens(local_tokenizer, ids)
    assert vocab == {t: local_tokenizer.decode([t]) for t in set(ids)}
    data = page_data(build_html(episodes, vocab=vocab))
    assert len(data["prompts"]) == 2  # 2 tasks × 2 samples: one prompt per task
    assert data["prompts"][data["episodes"][0]["prompt"]] == episodes[0]["prompt_ids"]
    assert data["vocab"] == {str(k): v for k, v in vocab.items()}
    assert page_data(build_html(episodes))["vocab"] is None


def test_cli_writes_the_page_beside_the_input(episodes_file, local_tokenizer_dir, capsys):
    assert main(["view", str(episodes_file), "--tokenizer", str(local_tokenizer_dir)]) == 0
    page = episodes_file.with_suffix(".html")
    assert f"wrote 8 episodes to {page}" in capsys.readouterr().out
    data = page_data(page.read_text())
    assert len(data["episodes"]) == 8 and data["vocab"]
    out = episodes_file.parent / "other.html"
    assert main(["view", str(episodes_file), "-o", str(out)]) == 0 and page_data(out.read_text())["vocab"] is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        ("", "no episodes (the file is empty)"),
        ("not json\n", "line 1: not a JSON line"),
        ('{"messages": []}\n[1, 2]\n', "line 2: a JSON list, not an episode object"),
        ('{"messages": []}\n\n{"score": 1.0}\n', "line 3: the record has no 'messages' list"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "line 1: not a JSON line"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(content, message, tmp_path, capsys):
    path = tmp_path / "episodes.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    assert main(["view", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not path.with_suffix(".html").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tokenizer", "/no/such/folder"], "--tokenizer /no/such/folder: no such folder"),
        (["-o", "/no/such/folder/page.html"], "cannot write /no/such/folder/page.html"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(argv, message, episodes_file, capsys):
    assert main(["view", str(episodes_file), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_folder_is_not_an_episodes_file(tmp_path, capsys):
    assert main(["view", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path}: not a file\n"


def test_the_page_never_overwrites_its_input(tmp_path, capsys):
    path = tmp_path / "episodes.html"
    path.write_text('{"messages": []}\n')
    assert main(["view", str(path)]) == 2
    assert "would overwrite its own input" in capsys.readouterr().err and path.read_text() == '{"messages": []}\n'


def test_a_large_file_is_read_with_a_progress_bar(oracle_records, tmp_path, capsys):
    line = json.dumps(oracle_records[0]) + "\n"
    path = tmp_path / "many.jsonl"
    copies = 4 * 1024 * 1024 // len(line) + 1  # just past the progress bar's threshold
    path.write_text(line * copies)
    page, count = write_view(path, progress=True)
    assert count == copies and "reading many.jsonl" in capsys.readouterr().err
    data = page_data(page.read_text())
    assert len(data["episodes"]) == copies and len(data["prompts"]) == 1


def test_the_page_assets_ship_inside_the_package():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    root = Path(__file__).resolve().parents[1]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["envkit.cli"]
    assets = sorted((root / "envkit" / "cli" / "view_assets").iterdir())
    assert {p.name for p in assets} >= {"view.html", "view.css", "view.js"}
    for path in assets:
        relative = path.relative_to(root / "envkit" / "cli").as_posix()
        assert any(fnmatch.fnmatch(relative, p) for p in patterns), f"{relative} is not in package-data"


CHROMIUM = next(
    (found for name in ("chromium", "chromium-browser", "google-chrome") if (found := shutil.which(name))), None
)


class _Elements(HTMLParser):
    """Every element of a dumped DOM as (tag, attributes), and the text inside each id'd element."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.text: dict[str, str] = {}
        self._open: list[str | None] = []
        self.html = html
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))
        self._open.append(dict(attrs).get("id"))

    def handle_endtag(self, tag: str) -> None:
        if self._open:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        for element_id in filter(None, self._open):
            self.text[element_id] = self.text.get(element_id, "") + data

    def having(self, attribute: str, value: str | None = None) -> list[dict[str, str | None]]:
        return [a for _, a in self.elements if attribute in a and (value is None or value in (a[attribute] or ""))]


def chromium(page: Path, fragment: str, tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    """Headless Chromium on ``page#fragment`` once its script ran (virtual time lets it finish first)."""
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",  # never shared with another browser running here
        "--virtual-time-budget=10000",
        *flags,
        f"{page.resolve().as_uri()}#{fragment}",
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, check=True)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary found (apt-get install chromium) for the browser test")
def test_the_page_in_headless_chromium(episodes_file, tmp_path):
    assert main(["view", str(episodes_file), "-o", str(tmp_path / "page.html")]) == 0
    page = tmp_path / "page.html"
    scores = [e["score"] for e in read_episodes(episodes_file)]
    winners = [str(i) for i, s in enumerate(scores) if s >= 1]
    assert 0 < len(winners) < len(scores)

    dom = _Elements(chromium(page, "min_score=1", tmp_path, "--dump-dom").stdout)
    assert dom.having("data-ready", "1"), "the page's script did not run"
    assert dom.text["count"].startswith(f"{len(winners)} of {len(scores)} episodes shown")
    assert dom.text["stats"].startswith(f"{len(scores)} episodes")
    assert [a["data-index"] for a in dom.having("data-index")] == winners  # the others are filtered out
    assert dom.having("class", "tool-call") and '<span class="tool-name">calculator</span>' in dom.html
    # The first shown episode is open: each completion token coloured by its env_mask (plus one legend chip each).
    mask = read_episodes(episodes_file)[int(winners[0])]["env_mask"]
    assert mask.count(0) > 0 and mask.count(1) > 0
    assert len(dom.having("class", "tok m")) == mask.count(1) + 1
    assert len(dom.having("class", "tok e")) == mask.count(0) + 1

    hostile = str(len(scores) - 1)
    dom = _Elements(chromium(page, "error=yes", tmp_path, "--dump-dom").stdout)
    assert [a["data-index"] for a in dom.having("data-index")] == [hostile]
    assert not dom.having("data-pwned") and not [a for tag, a in dom.elements if tag == "img"]
    assert sum(tag == "script" for tag, _ in dom.elements) == 2
    raw = chromium(page, f"open={hostile}", tmp_path, "--dump-dom").stdout
    assert "&lt;script&gt;document.body.setAttribute" in raw and "&lt;img src=x onerror=" in raw

    # Issue 39 item 9: the samples of a task under its header, the tools offered listed in the opened card.
    dom = _Elements(chromium(page, "", tmp_path, "--dump-dom").stdout)
    episodes = read_episodes(episodes_file)
    listed = [a["data-index"] for a in dom.having("data-index")]
    assert listed == [str(i) for i in grouped_order(episodes)] and listed != sorted(listed, key=int)
    headers = dom.having("data-task-seed")
    assert [h["data-task-seed"] for h in headers] == ["0", "1", "2"]  # the oracle's tasks, then the model's samples
    assert len(dom.having("class", "tool-params")) == 2 and "Tools offered (2)" in dom.html
    assert dom.html.count('class="badge tools"') == len(episodes)

    shot = tmp_path / "page.png"
    chromium(page, "", tmp_path, f"--screenshot={shot}", "--window-size=1280,1600", "--hide-scrollbars")
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert int.from_bytes(png[16:20], "big") == 1280 and int.from_bytes(png[20:24], "big") == 1600


# ---- issue 23 item 7: each episode's task in the list, turns cut by a token budget marked --------------------------
@pytest.fixture(scope="module")
def budget_file(tiny_model_dir, eval_file, tmp_path_factory) -> Path:
    """Real `envkit eval --out` records of episodes that end on their token budget: room for 6 tokens after the
    longest prompt, while the tiny model is allowed 32 per turn."""
    budget = max(len(json.loads(line)["prompt_ids"]) for line in eval_file.read_text().splitlines()) + 6
    out = tmp_path_factory.mktemp("budget") / "episodes.jsonl"
    argv = ["eval", "arithmetic", "--model", str(tiny_model_dir), "--tasks", "4", "--samples", "1", "--json"]
    argv += ["--max-new-tokens", "32", "--max-turns", "3", "--max-episode-tokens", str(budget), "--out", str(out)]
    assert main(argv) == 0
    return out


def test_each_episode_s_task_is_its_first_user_message_shortened(oracle_records):
    episode = normalize_episode(oracle_records[0])
    question = " ".join(oracle_records[0]["messages"][1]["content"].split())
    assert oracle_records[0]["messages"][1]["role"] == "user"
    assert episode["task"] == (question if len(question) <= 160 else question[:159].rstrip() + "…")
    long = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "word\n" * 100}]}
    task = normalize_episode(long)["task"]
    assert len(task) == 160 and task.endswith("…") and "\n" not in task and task.startswith("word word")
    assert normalize_episode({**long, "info": {"task": "Refund the broken kettle."}})["task"] == (
        "Refund the broken kettle."
    )
    assert normalize_episode({"messages": [{"role": "system", "content": "x"}]})["task"] == ""


def test_an_episode_that_ran_out_of_its_token_budget_marks_its_last_turn(budget_file, eval_file):
    # The tiny model rarely closes its turn within the 6 tokens of room (the episode then ends "done", uncut).
    episodes = [e for e in read_episodes(budget_file) if e["finish_reason"] != "done"]
    assert episodes and {e["finish_reason"] for e in episodes} == {"max_episode_tokens"}
    assert all(e["truncated"] for e in episodes)
    for episode in episodes:
        said = sum(m["role"] == "assistant" for m in episode["messages"])
        # the engine counts the cut turn, whose text it keeps only as tokens (no assistant message)
        assert episode["turns"] >= max(1, said) and episode["env_mask"][-1] == 1
        assert episode["cut_turns"] == {str(episode["turns"]): "max_episode_tokens"}
    for episode in read_episodes(eval_file):  # ended by max_turns: a turn is marked only where max_new_tokens cut it
        (reason,) = episode["turn_finish_reasons"]
        assert episode["cut_turns"] == ({"1": "max_new_tokens"} if reason == "length" else {}), episode
    record = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"}]}
    assert normalize_episode({**record, "finish_reason": "max_episode_tokens"})["cut_turns"] == {
        "1": "max_episode_tokens"
    }  # an older record without turns: its last assistant message
    # The engine's per-turn record marks a turn cut mid-episode at max_new_tokens, and the budget's cut.
    reasons = {"turn_finish_reasons": ["stop", "length", "closed", "budget"], "turns": 4}
    assert normalize_episode({**record, **reasons})["cut_turns"] == {"2": "max_new_tokens", "4": "max_episode_tokens"}


NODE = shutil.which("node")
DOM_SHIM = r"""
// A minimal DOM, enough for view.js: runs the page's own script on its own data and prints the tree as JSON.
const fs = require("fs");
const html = fs.readFileSync(process.argv[2], "utf8");
const data = html.match(/<script type="application\/json" id="episodes-data">([\s\S]*?)<\/script>/)[1];
const script = html.match(/<script>([\s\S]*?)<\/script>/)[1];
class Element {
  constructor(tag) {
    this.tagName = tag.toUpperCase(); this.children = []; this.className = ""; this.dataset = {}; this.own = "";
    this.options = []; this.value = ""; this.hidden = false; this.open = false; this.title = "";
    this.classList = { add: (name) => { this.className = (this.className + " " + name).trim(); } };
  }
  appendChild(child) {
    const added = child.fragment ? child.children : [child];
    this.children.push(...added);
    if (this.tagName === "SELECT") this.options.push(...added);
    return child;
  }
  set textContent(text) { this.children = []; this.own = String(text); }
  get textContent() { return this.own + this.children.map((c) => c.textContent).join(""); }
  addEventListener() {}
  tree() {
    return { tag: this.tagName.toLowerCase(), cls: this.className, text: this.own, title: this.title,
             data: this.dataset, children: this.children.map((c) => c.tree()) };
  }
}
const ids = {};
for (const [id, tag] of [["title", "h1"], ["stats", "p"], ["filters", "form"], ["min_score", "input"],
  ["max_score", "input"], ["finish_reason", "select"], ["error", "select"], ["q", "input"], ["clear", "button"],
  ["count", "p"], ["episodes", "main"], ["more", "button"], ["episodes-data", "script"]]) ids[id] = new Element(tag);
ids["episodes-data"].own = data;
global.document = {
  getElementById: (id) => ids[id], createElement: (tag) => new Element(tag), body: new Element("body"),
  createDocumentFragment: () => Object.assign(new Element("fragment"), { fragment: true }),
};
global.location = { hash: process.argv[3] ? "#" + process.argv[3] : "", search: "", pathname: "/page.html" };
global.history = { replaceState() {} };
global.window = { addEventListener() {} };
new Function(script)();
process.stdout.write(JSON.stringify({ ready: document.body.dataset.ready, episodes: ids["episodes"].tree() }));
"""


def run_page_script(page: Path, fragment: str, tmp_path: Path) -> dict:
    """The page's script run under node on a minimal DOM: the tree it built under ``#episodes``."""
    shim = tmp_path / "dom_shim.js"
    shim.write_text(DOM_SHIM)
    result = subprocess.run([NODE, str(shim), str(page), fragment], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def nodes(tree: dict, cls: str) -> list[dict]:
    """Every node of ``tree`` whose class list holds ``cls``."""
    found = [tree] if cls in tree["cls"].split() else []
    return found + [n for child in tree["children"] for n in nodes(child, cls)]


def text(tree: dict) -> str:
    return tree["text"] + "".join(text(child) for child in tree["children"])


@pytest.mark.skipif(NODE is None, reason="no node binary to run the page's script on a minimal DOM")
def test_the_page_lists_each_task_and_marks_the_cut_turn(budget_file, oracle_records, tmp_path):
    """The page's own script, run on its own data: each listed episode shows its task, and the turn its token budget
    cut carries a mark (the browser test above needs chromium; this one runs the same script under node)."""
    path = tmp_path / "episodes.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in oracle_records) + budget_file.read_text())
    page, count = write_view(path, tmp_path / "page.html", progress=False)
    episodes = read_episodes(path)
    cut = next(i for i, e in enumerate(episodes) if e["cut_turns"])
    built = run_page_script(page, f"open={cut}", tmp_path)
    assert built["ready"] == "1"
    cards = nodes(built["episodes"], "episode")
    order = grouped_order(episodes)
    assert [c["data"]["index"] for c in cards] == [str(i) for i in order] and len(order) == count
    for card, episode in zip(cards, [episodes[i] for i in order], strict=True):
        (task,) = nodes(card, "ep-prompt")
        assert task["text"] == episode["task"] and episode["task"]
    opened = cards[order.index(cut)]
    (last_turn,) = [n for n in nodes(opened, "msg") if "cut" in n["cls"].split()]
    turns = episodes[cut]["turns"]
    assert "role-assistant" in last_turn["cls"] and f"turn {turns}" in text(last_turn)
    if turns > sum(m["role"] == "assistant" for m in episodes[cut]["messages"]):
        assert "missing" in last_turn["cls"] and "its model tokens end the token view" in text(last_turn)
    (mark,) = [n for n in nodes(last_turn, "cut") if n["tag"] == "span"]
    assert mark["text"] == "cut: max_episode_tokens" and "token budget" in mark["title"]
    assert f"turn {turns} cut" in text(opened) and not nodes(cards[0], "cut")  # the summary says so; the oracle's not


def grouped_order(episodes: list[dict]) -> list[int]:
    """The order the page lists episodes in: the samples of a task (a seed, in one env: the same tools) together,
    tasks as they first appear."""

    def task(i: int) -> object:
        seed, tools = episodes[i]["task_seed"], json.dumps(episodes[i]["tools"])
        return (seed, tools) if isinstance(seed, int) else f"#{i}"

    rank: dict = {}
    for i in range(len(episodes)):
        rank.setdefault(task(i), len(rank))

    def key(i: int) -> tuple:
        return rank[task(i)], episodes[i]["group_index"], i

    return sorted(range(len(episodes)), key=key)


# ---- issue 39 item 9: score components and the expected answer beside the score, a task's samples together, the
# tools the model was offered ----------------------------------------------------------------------------------------
class SayNumber(envkit.ToolEnv):
    """Say the number the task names: its reset info carries the answer, its score has two components."""

    max_turns = 2

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        self.target, self.said = 3 + (seed or 0) % 5, None
        return [{"role": "user", "content": f"Say {self.target}."}], {"answer": self.target}

    @envkit.tool
    def say(self, value: int, shout: bool = False) -> str:
        """Say a number; this ends the episode.

        Args:
            value: The number to say.
            shout: Say it loudly.
        """
        self.said = value
        self.end_episode()
        return "said"

    def score(self) -> float:
        return float(self.said == self.target)

    def score_components(self) -> dict[str, float]:
        return {"right": self.score(), "spoke": float(self.said is not None)}

    def oracle(self):
        call = {"type": "function", "function": {"name": "say", "arguments": {"value": self.target}}}
        return {"role": "assistant", "content": "", "tool_calls": [call]}


@pytest.fixture(scope="module")
def say_records(local_tokenizer) -> list[dict]:
    """Oracle episodes of SayNumber through the rollout engine, task 0 twice (its samples apart in the file)."""
    episodes = oracle_episodes(SayNumber, local_tokenizer, [0, 1, 0])
    records = [json.loads(e.to_json()) for e in episodes]
    records[2]["group_index"] = 1
    return records


def test_episode_records_carry_the_tools_offered_and_the_view_reads_them(say_records, oracle_records):
    record = say_records[0]
    assert [t["function"]["name"] for t in record["tools"]] == ["say"]  # written by the engine, as reset gave them
    assert record["score_components"] == {"right": 1.0, "spoke": 1.0} and record["info"] == {"answer": 3}
    episode = normalize_episode(record)
    assert episode["tools"] == [
        {
            "name": "say",
            "description": "Say a number; this ends the episode.",
            "parameters": [
                {"name": "value", "type": "integer", "required": True, "description": "The number to say."},
                {"name": "shout", "type": "boolean", "required": False, "description": "Say it loudly."},
            ],
        }
    ]
    assert episode["score_components"] == {"right": 1.0, "spoke": 1.0} and episode["expected"] == "3"
    arithmetic = normalize_episode(oracle_records[0])
    assert [t["name"] for t in arithmetic["tools"]] == ["calculator", "submit_answer"]
    assert arithmetic["expected"] is None and arithmetic["score_components"] == {}
    # a seed-style env's dataset row, odd values, and records from before envkit wrote tools
    row = {"messages": [], "info": {"row": {"solution": {"x": [1, 2]}}}, "tools": [1, {"function": {}}]}
    assert normalize_episode(row)["expected"] == '{"x": [1, 2]}' and normalize_episode(row)["tools"] == []
    assert normalize_episode({"messages": [], "score_components": {"a": float("nan")}})["score_components"] == {
        "a": "nan"
    }


def test_tool_sets_are_stored_once(oracle_records, say_records):
    data = page_data(build_html([normalize_episode(r) for r in [*oracle_records, *say_records]]))
    assert [[t["name"] for t in s] for s in data["toolsets"]] == [["calculator", "submit_answer"], ["say"]]
    assert [e["toolset"] for e in data["episodes"]] == [0, 0, 0, 1, 1, 1]
    assert "tools" not in data["episodes"][0]


@pytest.mark.skipif(NODE is None, reason="no node binary to run the page's script on a minimal DOM")
def test_the_page_groups_a_task_s_samples_and_shows_components_expected_and_tools(
    say_records, oracle_records, tmp_path
):
    path = tmp_path / "episodes.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [*say_records, *oracle_records[:1]]))
    page, _ = write_view(path, tmp_path / "page.html", progress=False)
    built = run_page_script(page, "open=2", tmp_path)
    root = built["episodes"]
    flat = [n for n in _walk(root) if "group" in n["cls"].split() or "episode" in n["cls"].split()]
    listed = [("task " + n["data"]["taskSeed"]) if "group" in n["cls"].split() else n["data"]["index"] for n in flat]
    # sample 1 of task 0 (line 3) listed under task 0; arithmetic's task 0 (another env: other tools) on its own
    assert listed == ["task 0", "0", "2", "task 1", "1", "task 0", "3"]
    header = next(n for n in flat if n["data"].get("taskSeed") == "0")
    assert text(header) == "task 0 · 2 samples · mean score 1 · 2 of 2 at score 1expected: 3"
    card = next(n for n in flat if n["data"].get("index") == "2")
    (components,) = nodes(card, "ep-components")
    assert components["text"] == "right 1 · spoke 1" and nodes(card, "ep-expected")[0]["text"] == "expected 3"
    (tools_badge,) = nodes(card, "tools")
    assert tools_badge["text"] == "1 tool" and tools_badge["title"] == "say(value: integer, shout?: boolean)"
    (offered,) = nodes(card, "tools-offered")  # the opened card: its tools listed, the prompt not expanded
    assert text(offered) == "say(value: integer, shout?: boolean)Say a number; this ends the episode."
    facts = text(nodes(card, "facts")[0])
    assert "score componentsright 1 · spoke 1" in facts and "expected answer3" in facts


def _walk(tree: dict) -> list[dict]:
    return [tree] + [n for child in tree["children"] for n in _walk(child)]
