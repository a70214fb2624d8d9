// envkit view: renders the embedded episodes. Episode text only ever goes through textContent, never innerHTML.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("episodes-data").textContent);
  var episodes = data.episodes;
  var vocab = data.vocab;
  var PAGE = 50;
  var FILTERS = ["min_score", "max_score", "finish_reason", "error", "q"];
  var state = { shown: PAGE, open: null, matching: [], tasks: 0 };
  // The samples of one task (the same task seed, the same tools) are listed together, tasks in the order they first appear.
  var taskRank = {};
  var tasks = {};
  episodes.forEach(function (ep, i) {
    var key = taskKey(ep, i);
    if (!(key in taskRank)) { taskRank[key] = Object.keys(taskRank).length; tasks[key] = []; }
    tasks[key].push(ep);
  });

  // A task: its seed in one env (the tools offered tell the envs of a merged file apart).
  function taskKey(ep, i) {
    return typeof ep.task_seed === "number" ? "seed " + ep.task_seed + " tools " + ep.toolset : "episode " + i;
  }

  function byId(id) { return document.getElementById(id); }

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function fmt(value, digits) {
    if (typeof value !== "number") return value === null || value === undefined ? "–" : String(value);
    return Number.isInteger(value) ? String(value) : value.toFixed(digits === undefined ? 3 : digits);
  }

  function pretty(value) {
    if (typeof value === "string") return value;
    try { return JSON.stringify(value, null, 2); } catch (e) { return String(value); }
  }

  function searchText(ep) {
    if (ep._text === undefined) {
      var parts = [ep.error || "", ep.finish_reason, ep.task || ""];
      ep.messages.forEach(function (m) {
        parts.push(typeof m.content === "string" ? m.content : pretty(m.content));
        (m.tool_calls || []).forEach(function (c) { parts.push(pretty(c)); });
      });
      ep._text = parts.join("\n").toLowerCase();
    }
    return ep._text;
  }

  function readFilters() {
    var values = {};
    FILTERS.forEach(function (name) { values[name] = byId(name).value.trim(); });
    return values;
  }

  function matches(ep, f) {
    var score = typeof ep.score === "number" ? ep.score : NaN;
    if (f.min_score !== "" && !(score >= Number(f.min_score))) return false;
    if (f.max_score !== "" && !(score <= Number(f.max_score))) return false;
    if (f.finish_reason !== "" && ep.finish_reason !== f.finish_reason) return false;
    if (f.error === "yes" && !ep.error) return false;
    if (f.error === "no" && ep.error) return false;
    if (f.q !== "" && searchText(ep).indexOf(f.q.toLowerCase()) < 0) return false;
    return true;
  }

  // The filters live in the URL's hash (or query), so a link or `file://…#min_score=1` opens a filtered view.
  function loadParams() {
    var text = location.hash.length > 1 ? location.hash.slice(1) : location.search.slice(1);
    var params = new URLSearchParams(text);
    FILTERS.forEach(function (name) {
      var input = byId(name);
      var value = params.get(name) || "";
      if (input.tagName === "SELECT" && value && !Array.prototype.some.call(input.options, function (o) {
        return o.value === value;
      })) {
        input.appendChild(el("option", null, value)).value = value;
      }
      input.value = value;
    });
    var open = params.get("open");
    state.open = open === null || open === "" ? null : open;
  }

  function saveParams() {
    var params = new URLSearchParams();
    var f = readFilters();
    FILTERS.forEach(function (name) { if (f[name] !== "") params.set(name, f[name]); });
    if (state.open !== null) params.set("open", state.open);
    var hash = params.toString();
    try { history.replaceState(null, "", hash ? "#" + hash : location.pathname + location.search); } catch (e) { /* file:// in some browsers */ }
  }

  function header() {
    byId("title").textContent = data.title;
    var scores = episodes.map(function (e) { return e.score; }).filter(function (s) { return typeof s === "number"; });
    var mean = scores.length ? scores.reduce(function (a, b) { return a + b; }, 0) / scores.length : null;
    var reasons = {};
    var errors = 0;
    episodes.forEach(function (e) {
      reasons[e.finish_reason || "(none)"] = (reasons[e.finish_reason || "(none)"] || 0) + 1;
      if (e.error) errors += 1;
    });
    var parts = [episodes.length + " episodes", "mean score " + fmt(mean), errors + " with an error"];
    Object.keys(reasons).sort().forEach(function (r) { parts.push(r + ": " + reasons[r]); });
    byId("stats").textContent = parts.join(" · ");
    var select = byId("finish_reason");
    Object.keys(reasons).sort().forEach(function (r) {
      if (r === "(none)") return;
      var option = el("option", null, r + " (" + reasons[r] + ")");
      option.value = r;
      select.appendChild(option);
    });
  }

  function render() {
    var f = readFilters();
    state.matching = [];
    episodes.forEach(function (ep, i) { if (matches(ep, f)) state.matching.push(i); });
    state.matching.sort(function (a, b) {
      var ea = episodes[a], eb = episodes[b];
      return taskRank[taskKey(ea, a)] - taskRank[taskKey(eb, b)] ||
        (typeof ea.group_index === "number" && typeof eb.group_index === "number" ? ea.group_index - eb.group_index : 0) ||
        a - b;
    });
    var seen = {};
    state.matching.forEach(function (i) { seen[taskKey(episodes[i], i)] = true; });
    state.tasks = Object.keys(seen).length;
    var wanted = state.open === null ? -1 : state.matching.indexOf(Number(state.open));
    if (wanted >= state.shown) state.shown = (Math.floor(wanted / PAGE) + 1) * PAGE;
    byId("episodes").textContent = "";
    byId("count").dataset.matching = String(state.matching.length);
    if (state.matching.length === 0) byId("episodes").appendChild(el("p", "empty", "No episode matches the filters."));
    appendCards(0);
  }

  // Only a page of cards is built at a time (and each card's body only when opened), so big files stay responsive.
  function appendCards(from) {
    var list = byId("episodes");
    var count = Math.min(state.shown, state.matching.length);
    for (var k = from; k < count; k++) {
      var i = state.matching[k];
      var key = taskKey(episodes[i], i);
      if (typeof episodes[i].task_seed === "number" &&
          (k === 0 || taskKey(episodes[state.matching[k - 1]], state.matching[k - 1]) !== key)) {
        list.appendChild(groupHeader(episodes[i].task_seed, tasks[key]));
      }
      list.appendChild(card(episodes[i], i, state.open === null ? k === 0 : String(i) === state.open));
    }
    byId("count").textContent = state.matching.length + " of " + episodes.length + " episodes shown, " +
      state.tasks + (state.tasks === 1 ? " task" : " tasks") +
      (count < state.matching.length ? " (the first " + count + " listed)" : "");
    byId("more").hidden = count >= state.matching.length;
  }

  function badge(text, cls) { return el("span", "badge " + (cls || ""), text); }

  // One task's header: its samples (all of them, whatever the filters show) and how they scored.
  function groupHeader(seed, samples) {
    var scores = samples.map(function (e) { return e.score; }).filter(function (s) { return typeof s === "number"; });
    var mean = scores.length ? scores.reduce(function (a, b) { return a + b; }, 0) / scores.length : null;
    var solved = scores.filter(function (s) { return s >= 1; }).length;
    var head = el("h2", "group", "task " + seed + " · " + samples.length + (samples.length === 1 ? " sample" : " samples") +
      " · mean score " + fmt(mean) + " · " + solved + " of " + samples.length + " at score 1");
    head.dataset.taskSeed = String(seed);
    var expected = samples[0].expected;
    if (expected !== null && expected !== undefined) head.appendChild(el("span", "expected", "expected: " + expected));
    return head;
  }

  function componentsText(components) {
    return Object.keys(components || {}).map(function (k) { return k + " " + fmt(components[k]); }).join(" · ");
  }

  function toolSignature(tool) {
    return tool.name + "(" + tool.parameters.map(function (p) {
      return p.name + (p.required ? "" : "?") + (p.type ? ": " + p.type : "");
    }).join(", ") + ")";
  }

  // The tools the model was offered, listed without decoding (or expanding) the prompt.
  function toolsView(set) {
    var list = el("ul", "tools-offered");
    set.forEach(function (tool) {
      var item = el("li", "tool");
      item.appendChild(el("span", "tool-name", tool.name));
      item.appendChild(el("span", "tool-params", toolSignature(tool).slice(tool.name.length)));
      if (tool.description) item.appendChild(el("span", "tool-desc", tool.description));
      item.title = tool.parameters.map(function (p) { return p.name + ": " + (p.description || p.type || ""); }).join("\n");
      list.appendChild(item);
    });
    return list;
  }

  function card(ep, index, open) {
    var details = el("details", "episode");
    details.dataset.index = String(index);
    details.dataset.score = String(ep.score);
    details.dataset.finishReason = ep.finish_reason;
    if (ep.error) details.classList.add("has-error");
    var summary = el("summary");
    summary.appendChild(el("span", "ep-id", "#" + index));
    summary.appendChild(el("span", "ep-task", "task " + fmt(ep.task_seed) + " · sample " + fmt(ep.group_index)));
    if (ep.task) {
      var task = el("span", "ep-prompt", ep.task);
      task.title = "the episode's task: its info's task, else its first user message";
      summary.appendChild(task);
    }
    var cuts = Object.keys(ep.cut_turns || {});
    if (cuts.length) summary.appendChild(badge("turn " + cuts.join(", ") + " cut", "cut"));
    var ok = typeof ep.score === "number" && ep.score >= 1;
    summary.appendChild(badge("score " + fmt(ep.score), ok ? "good" : ep.score > 0 ? "partial" : "bad"));
    var parts = componentsText(ep.score_components);
    if (parts) {
      var components = el("span", "ep-components", parts);
      components.title = "score components (the env's score_components())";
      summary.appendChild(components);
    }
    if (ep.expected !== null && ep.expected !== undefined) {
      var expected = el("span", "ep-expected", "expected " + ep.expected);
      expected.title = "the task's expected answer (from the episode's reset info)";
      summary.appendChild(expected);
    }
    summary.appendChild(badge(ep.finish_reason || "no finish reason", "finish"));
    summary.appendChild(el("span", "ep-meta", fmt(ep.turns) + " turns · " + fmt(ep.num_tool_calls) +
      " tool calls · " + fmt(ep.tool_errors) + " tool errors" + (ep.truncated ? " · truncated" : "")));
    if (ep.error) summary.appendChild(badge("error", "bad"));
    var offered = data.toolsets[ep.toolset] || [];
    if (offered.length) {
      var toolsBadge = badge(offered.length + (offered.length === 1 ? " tool" : " tools"), "tools");
      toolsBadge.title = offered.map(toolSignature).join("\n");
      summary.appendChild(toolsBadge);
    }
    details.appendChild(summary);
    var quiet = open;  // the toggle event of opening it here is not the reader's choice: keep it out of the URL
    details.addEventListener("toggle", function () {
      if (quiet) { quiet = false; return; }
      if (details.open && !details.dataset.rendered) {
        details.dataset.rendered = "1";
        details.appendChild(body(ep));
      }
      if (details.open) { state.open = String(index); saveParams(); }
    });
    details.open = open;
    if (open) { details.dataset.rendered = "1"; details.appendChild(body(ep)); }
    return details;
  }

  function body(ep) {
    var root = el("div", "ep-body");
    if (ep.error) {
      var box = el("div", "error-box");
      box.appendChild(el("strong", null, "error: "));
      box.appendChild(el("span", "error-text", ep.error));
      root.appendChild(box);
    }
    var facts = el("dl", "facts");
    function fact(name, value) { facts.appendChild(el("dt", null, name)); facts.appendChild(el("dd", null, value)); }
    fact("score", fmt(ep.score, 4));
    if (Object.keys(ep.score_components || {}).length) fact("score components", componentsText(ep.score_components));
    if (ep.expected !== null && ep.expected !== undefined) fact("expected answer", ep.expected);
    fact("finish reason", ep.finish_reason || "–");
    fact("rewards", ep.rewards.map(function (r) { return fmt(r); }).join(", ") || "–");
    fact("timings (s)", Object.keys(ep.timings).map(function (k) { return k + " " + fmt(ep.timings[k]); }).join(" · ") || "–");
    if (Object.keys(ep.info).length) fact("info", pretty(ep.info));
    root.appendChild(facts);
    var offered = data.toolsets[ep.toolset] || [];
    if (offered.length) {
      root.appendChild(el("h3", null, "Tools offered (" + offered.length + ")"));
      root.appendChild(toolsView(offered));
    }
    root.appendChild(el("h3", null, "Transcript"));
    root.appendChild(transcript(ep.messages, ep.cut_turns || {}));
    root.appendChild(el("h3", null, "Tokens"));
    root.appendChild(tokens(ep));
    return root;
  }

  var CUT_TITLES = {
    max_episode_tokens: "the episode's token budget (max_episode_tokens / max_completion_tokens) ran out at this turn",
    max_new_tokens: "this turn reached the per-turn budget (max_new_tokens / max_completion_length) before it ended"
  };

  function transcript(messages, cutTurns) {
    var list = el("ol", "transcript");
    var turn = 0;
    messages.forEach(function (m) {
      var role = typeof m.role === "string" ? m.role : "?";
      var item = el("li", "msg role-" + role.replace(/[^a-z]/g, ""));
      var head = el("div", "msg-head");
      head.appendChild(el("span", "role", role));
      if (role === "assistant") {
        turn += 1;
        head.appendChild(el("span", "turn", "turn " + turn));
        var cut = cutTurns[String(turn)];
        if (cut) {
          item.classList.add("cut");
          var mark = badge("cut: " + cut, "cut");
          mark.title = CUT_TITLES[cut] || cut;
          head.appendChild(mark);
        }
      }
      if (m.name !== undefined) head.appendChild(el("span", "tool-name", String(m.name)));
      item.appendChild(head);
      var content = m.content;
      if (content !== null && content !== undefined && content !== "") {
        var text = el("div", "content", pretty(content));
        if (role === "tool" && typeof content === "string" && content.indexOf("Error:") === 0) {
          item.classList.add("tool-error");
        }
        item.appendChild(text);
      }
      (Array.isArray(m.tool_calls) ? m.tool_calls : m.tool_calls ? [m.tool_calls] : []).forEach(function (call) {
        var fn = call && typeof call === "object" && call.function && typeof call.function === "object" ? call.function : call;
        var box = el("div", "tool-call");
        box.appendChild(el("span", "arrow", "→ "));
        box.appendChild(el("span", "tool-name", fn && fn.name !== undefined ? String(fn.name) : "(no name)"));
        box.appendChild(el("pre", "arguments", pretty(fn && fn.arguments !== undefined ? fn.arguments : call)));
        item.appendChild(box);
      });
      Object.keys(m).forEach(function (key) {
        if (["role", "content", "tool_calls", "name"].indexOf(key) >= 0) return;
        var extra = el("div", "extra");
        extra.appendChild(el("span", "key", key + ": "));
        extra.appendChild(el("span", null, pretty(m[key])));
        item.appendChild(extra);
      });
      list.appendChild(item);
    });
    Object.keys(cutTurns).forEach(function (n) {
      if (Number(n) <= turn) return;
      // The engine keeps a turn the token budget cut as tokens only: say so where its message would be.
      var item = el("li", "msg role-assistant cut missing");
      var head = el("div", "msg-head");
      head.appendChild(el("span", "role", "assistant"));
      head.appendChild(el("span", "turn", "turn " + n));
      var mark = badge("cut: " + cutTurns[n], "cut");
      mark.title = CUT_TITLES[cutTurns[n]] || cutTurns[n];
      head.appendChild(mark);
      item.appendChild(head);
      item.appendChild(el("div", "content", "(no message: this turn was cut before it ended; its model tokens end the token view below)"));
      list.appendChild(item);
    });
    return list;
  }

  function piece(id) {
    if (!vocab) return String(id);
    var text = vocab[String(id)];
    if (text === null || text === undefined) return "⟨" + id + "⟩";
    return text === "" ? "∅" : text.replace(/\n/g, "↵\n").replace(/\t/g, "→\t");
  }

  function tokenSpans(ids, kinds, logprobs) {
    var box = el("div", "tokens" + (vocab ? "" : " ids"));
    var fragment = document.createDocumentFragment();
    ids.forEach(function (id, i) {
      var kind = kinds(i);
      var span = el("span", "tok " + kind, piece(id));
      var lp = logprobs && i < logprobs.length ? logprobs[i] : null;
      span.title = "id " + id + " · " + { m: "model", e: "env", p: "prompt", u: "no mask" }[kind] +
        (kind === "m" && lp !== null ? " · logprob " + fmt(lp, 4) : "");
      fragment.appendChild(span);
    });
    box.appendChild(fragment);
    return box;
  }

  function tokens(ep) {
    var root = el("div", "token-view");
    var ids = ep.completion_ids;
    var model = 0;
    var logprobSum = 0;
    ep.env_mask.forEach(function (m, i) {
      if (m === 1) { model += 1; if (typeof ep.logprobs[i] === "number") logprobSum += ep.logprobs[i]; }
    });
    var prompt = data.prompts[ep.prompt] || [];
    var legend = el("p", "legend");
    legend.appendChild(el("span", "tok m", "model token"));
    legend.appendChild(el("span", "tok e", "env token"));
    legend.appendChild(el("span", "tok p", "prompt token"));
    legend.appendChild(el("span", "legend-text", prompt.length + " prompt tokens · " + ids.length +
      " completion tokens: " + model + " model, " + (ids.length - model) + " env" +
      (model ? " · mean model logprob " + fmt(logprobSum / model) : "") + (vocab ? "" : " · token ids (no --tokenizer)")));
    root.appendChild(legend);
    if (ep.env_mask.length !== ids.length) {
      root.appendChild(el("p", "warning", "env_mask has " + ep.env_mask.length + " entries for " + ids.length + " tokens"));
    }
    var promptBox = el("details", "prompt-tokens");
    promptBox.appendChild(el("summary", null, "prompt (" + prompt.length + " tokens)"));
    promptBox.addEventListener("toggle", function () {
      if (promptBox.open && !promptBox.dataset.rendered) {
        promptBox.dataset.rendered = "1";
        promptBox.appendChild(tokenSpans(prompt, function () { return "p"; }, null));
      }
    });
    root.appendChild(promptBox);
    root.appendChild(tokenSpans(ids, function (i) {
      var m = ep.env_mask[i];
      return m === 1 ? "m" : m === 0 ? "e" : "u";
    }, ep.logprobs));
    return root;
  }

  function onFilter() {
    state.shown = PAGE;
    state.open = null;
    saveParams();
    render();
  }

  header();
  loadParams();
  render();
  byId("filters").addEventListener("input", onFilter);
  byId("filters").addEventListener("submit", function (event) { event.preventDefault(); });
  byId("clear").addEventListener("click", function () {
    FILTERS.forEach(function (name) { byId(name).value = ""; });
    onFilter();
  });
  byId("more").addEventListener("click", function () {
    var from = Math.min(state.shown, state.matching.length);
    state.shown += PAGE;
    appendCards(from);
  });
  window.addEventListener("hashchange", function () { loadParams(); state.shown = PAGE; render(); });
  document.body.dataset.ready = "1";
})();
