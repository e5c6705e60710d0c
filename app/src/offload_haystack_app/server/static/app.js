// The reference server's page: the tenant's chats, a chat, pending approvals, offloaded results with a paged viewer,
// and the session's audit trail. Everything model- or tool-written is inserted with textContent, never as HTML.
"use strict";

const PAGE_BYTES = 4096;
// Raster images the server serves inline (routes.INLINE_MEDIA_TYPES): shown as thumbnails in the chat.
const INLINE_IMAGE_TYPES = new Set(["image/png", "image/jpeg", "image/gif", "image/webp"]);
const SUGGESTIONS = [
  "Research solar panels, dump the invoices table and chart revenue",
  "Check the logs of billing, search and payroll",
  "Send an invoice to Initech for 250 EUR",
  "Read back the search results for \"result 7\"",
  "List my results",
];

const state = {
  token: "", session: "", signedIn: false, viewer: null, status: null, resumable: false, attempt: 0, offered: null,
  pending: [], sessions: [], images: new Map(), live: null,
};
const $ = (id) => document.getElementById(id);

function element(tag, options = {}, children = []) {
  const node = document.createElement(tag);
  if (options.className) node.className = options.className;
  if (options.text !== undefined && options.text !== null) node.textContent = options.text;
  if (options.testid) node.dataset.testid = options.testid;
  for (const [name, value] of Object.entries(options.attrs || {})) node.setAttribute(name, value);
  if (options.onclick) node.addEventListener("click", options.onclick);
  for (const child of children) if (child) node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
  return node;
}

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.detail) || `HTTP ${status}`);
    this.status = status;
    this.body = body || {};
  }
}

async function api(path, options = {}) {
  const token = options.token !== undefined ? options.token : state.token;
  const headers = Object.assign({ Authorization: `Bearer ${token}` }, options.headers || {});
  if (options.json !== undefined) {
    headers["Content-Type"] = "application/json";
    options.body = JSON.stringify(options.json);
  }
  const response = await fetch(path, { method: options.method || "GET", headers, body: options.body });
  if (options.raw) {
    if (!response.ok) throw new ApiError(response.status, await response.json().catch(() => null));
    return response;
  }
  const body = await response.json().catch(() => null);
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}

const sessionPath = (suffix = "") => `/api/sessions/${encodeURIComponent(state.session)}${suffix}`;
const resultPath = (reference) => sessionPath(`/results/${encodeURIComponent(reference)}`);

function setStatus(text, bad = false) {
  $("status").textContent = text;
  $("status").classList.toggle("bad", bad);
}

function formatBytes(size) {
  if (size < 1024) return `${size} B`;
  if (size < 1024 * 1024) return `${(size / 1024).toFixed(1)} KB`;
  return `${(size / 1024 / 1024).toFixed(1)} MB`;
}

// "customer=Initech, amount=50": arguments as a person reads them (strings unquoted, the rest as JSON).
function formatArguments(args) {
  const entries = Object.entries(args || {});
  if (!entries.length) return "no arguments";
  return entries.map(([name, value]) => `${name}=${typeof value === "string" ? value : JSON.stringify(value)}`).join(", ");
}

function formatAgo(iso) {
  if (!iso) return "";
  const seconds = (Date.now() - new Date(iso).getTime()) / 1000;
  if (seconds < 60) return "just now";
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.round(seconds / 3600)} h ago`;
  return new Date(iso).toLocaleDateString();
}

// Model badge: a scripted model says so, in the page as in the logs.
async function showModel() {
  const health = await fetch("/api/health").then((response) => response.json());
  const badge = $("model-badge");
  badge.textContent = health.scripted ? `SCRIPTED · ${health.model}` : `model: ${health.model}`;
  badge.title = badge.textContent;
  badge.classList.toggle("scripted", health.scripted);
}

// Signing in

async function connect(event) {
  if (event) event.preventDefault();
  const attempt = ++state.attempt;
  const token = $("token").value.trim();
  const session = $("session").value.trim() || "chat-1";
  $("login-error").textContent = "";
  try {
    const me = await api("/api/me", { token });
    if (attempt !== state.attempt) return;  // a newer sign-in (e.g. "Switch") started meanwhile: it wins
    state.token = token;
    localStorage.setItem("offload-token", token);
    signedIn(me);
    await openSession(session);
  } catch (error) {
    if (attempt !== state.attempt) return;
    if (error.status === 401) {
      // A token the server refuses protects no account (a restarted demo server prints new ones): forget it, so the
      // next login link signs in at once instead of asking to replace it.
      if (localStorage.getItem("offload-token") === token) localStorage.removeItem("offload-token");
      signedOut();
    }
    $("login-error").textContent = error.status === 401 ? "Unknown token." : error.message;
  }
}

function signedIn(me) {
  state.signedIn = true;
  document.body.classList.add("signed-in");
  document.body.classList.remove("login-open");
  $("account-toggle").setAttribute("aria-expanded", "false");
  $("tenant-badge").textContent = `tenant: ${me.tenant}`;
  $("tenant-badge").hidden = false;
  for (const id of ["message", "send", "new-chat"]) $(id).disabled = false;
}

function signedOut() {
  state.signedIn = false;
  state.token = "";
  state.session = "";
  state.sessions = [];
  state.pending = [];
  forgetImages();
  closeViewer();
  document.body.classList.remove("signed-in");
  $("tenant-badge").hidden = true;
  for (const id of ["message", "send", "new-chat"]) $(id).disabled = true;
  $("chat-title").textContent = "";
  $("chat-meta").textContent = "";
  $("transcript").replaceChildren(element("p", { className: "muted empty", text: "Open a chat with your token, then send a message." }));
  $("sessions").replaceChildren(element("li", { className: "muted", text: "Sign in to see your chats." }));
  $("session-count").textContent = "0";
  $("approvals").replaceChildren(element("p", { className: "muted", text: "Nothing waits for approval." }));
  $("approval-count").textContent = "0";
  $("results").replaceChildren(element("li", { className: "muted", text: "No results stored yet." }));
  $("result-count").textContent = "0";
}

async function openSession(session) {
  if (session !== state.session) {
    forgetImages();
    closeViewer();
    $("audit-count").hidden = true;
    $("audit").replaceChildren(element("li", { className: "muted", text: "Loading…" }));
  }
  state.session = session;
  $("session").value = session;
  localStorage.setItem("offload-session", session);
  $("chat-title").textContent = session;
  renderSessions();
  await Promise.all([refreshAll(), loadSessions()]);
}

function newChat() {
  openSession(`chat-${Date.now().toString(36)}`);
  $("message").focus();
}

// The tenant's chats

async function loadSessions() {
  try {
    const { sessions } = await api("/api/sessions");
    state.sessions = sessions;
  } catch (error) {
    setStatus(`Could not list your chats: ${error.message}`, true);
  }
  renderSessions();
}

function renderSessions() {
  const list = $("sessions");
  list.replaceChildren();
  const sessions = state.sessions.slice();
  // A chat opened but not written to yet is not stored anywhere: list it until it is.
  if (state.session && !sessions.some((item) => item.session === state.session)) {
    sessions.unshift({ session: state.session, turns: 0, results: 0, last_activity: null });
  }
  $("session-count").textContent = String(sessions.length);
  for (const item of sessions) {
    const current = item.session === state.session;
    const meta = item.turns ? `${item.turns} turn${item.turns === 1 ? "" : "s"}` : "new";
    const ago = formatAgo(item.last_activity);
    list.appendChild(element("li", {}, [
      element("button", {
        className: `session${current ? " current" : ""}`, testid: "session-item",
        attrs: Object.assign({ type: "button", title: item.session }, current ? { "aria-current": "true" } : {}),
        onclick: () => { if (item.session !== state.session) openSession(item.session); },
      }, [
        element("span", { className: "name", text: item.session }),
        element("span", { className: "muted meta", text: ago ? `${meta} · ${ago}` : meta }),
      ]),
    ]));
  }
}

// Refreshing the chat and its panels

async function refreshAll() {
  const session = state.session;
  if (!session) return;
  try {
    const [transcript, approvals, results] = await Promise.all([
      api(sessionPath("/messages")), api(sessionPath("/approvals")), api(sessionPath("/results")),
    ]);
    if (session !== state.session) return;  // another chat was opened meanwhile
    state.status = transcript.status;
    state.resumable = Boolean(transcript.resumable);
    state.pending = approvals.pending;
    renderTranscript(transcript);
    renderApprovals();
    renderResults(results.results);
    if ($("audit-panel").open) await loadAudit();
  } catch (error) {
    if (session === state.session) setStatus(`Error: ${error.message}`, true);
  }
}

// Transcript

function renderEvent(event) {
  const card = (kind, icon, children, extra = null) => element("div", { className: `event ${kind}`, testid: `event-${kind}` }, [
    element("span", { className: "event-icon", text: icon, attrs: { "aria-hidden": "true" } }),
    element("div", { className: "event-body" }, children),
    extra,
  ]);
  if (event.kind === "approval_required") {
    const requests = event.request_ids.map((id) => state.pending.find((item) => item.request_id === id)).filter(Boolean);
    const what = requests.map((item) => `${item.tool_name} with ${formatArguments(item.arguments)}`).join("; ");
    const review = element("button", {
      className: "small secondary", text: "Review", testid: "review-approvals", attrs: { type: "button" },
      onclick: () => {
        $("approvals-panel").scrollIntoView({ block: "start" });
        const approve = $("approvals").querySelector("[data-testid=approve]");
        if (approve) approve.focus({ preventScroll: true });
      },
    });
    return card("waiting", "◷", [
      element("strong", { text: "Waiting for approval" }),
      what ? `: ${what}` : requests.length || state.status !== "approval_required" ? ""
        : state.resumable ? " (decided; not finished)" : " (the requests expired)",
    ], requests.length ? review : null);
  }
  if (event.kind === "approved") {
    return card("approved", "✓", [
      element("strong", { text: `Approved ${event.tool_name}` }),
      " with ",
      element("code", { text: formatArguments(event.arguments) }),
      event.edited ? " (edited)" : "",
    ]);
  }
  const titles = { denied: "Denied", expired: "Not approved in time", not_run: "Not run" };
  return card("denied", "✕", [
    element("strong", { text: `${titles[event.kind] || "Not run"} ${event.tool_name}` }),
    event.reason ? `: ${event.reason}` : "",
  ]);
}

function renderMessage(message) {
  if (message.event) return renderEvent(message.event);
  if (message.role === "user") {
    return element("div", { className: "msg user", testid: "msg-user" }, [
      element("div", { className: "who", text: "you" }),
      element("div", { text: message.text }),
    ]);
  }
  if (message.role === "assistant") {
    const children = [element("div", { className: "who", text: "assistant" })];
    if (message.text) children.push(element("div", { text: message.text }));
    for (const call of message.tool_calls || []) {
      children.push(element("div", { className: "call", text: `→ ${call.tool_name}(${formatArguments(call.arguments)})` }));
    }
    return element("div", { className: "msg assistant", testid: "msg-assistant" }, children);
  }
  const result = message.tool_result;
  if (!result) return null;
  const stored = result.offloaded_results || result.offloaded.map((reference) => ({ reference, media_type: null }));
  const refs = element("div", { className: "offloaded" });
  for (const item of stored) {
    if (INLINE_IMAGE_TYPES.has(item.media_type)) {
      refs.appendChild(thumbnail(item.reference, result.tool_name));
      continue;
    }
    refs.appendChild(element("button", {
      className: "secondary", text: "open stored result", testid: "open-offloaded",
      attrs: { title: item.reference, type: "button" }, onclick: () => openResult(item.reference),
    }));
  }
  return element("div", { className: `msg tool${result.error ? " error" : ""}`, testid: "msg-tool" }, [
    element("div", { className: "who", text: `${result.tool_name} result${stored.length ? " · offloaded" : ""}` }),
    element("div", { text: result.text }),
    stored.length ? refs : null,
  ]);
}

// An image a tool produced, from the result route (with the bearer header), shown from a blob: URL.
function thumbnail(reference, toolName) {
  const image = element("img", { attrs: { alt: `image from ${toolName}` } });
  const button = element("button", {
    className: "thumb", testid: "thumbnail", attrs: { type: "button", title: `${reference} (click to enlarge)` },
    onclick: () => openResult(reference),
  }, [image]);
  imageUrl(reference).then((url) => { image.src = url; }).catch(() => { image.alt = "image unavailable"; });
  return button;
}

function imageUrl(reference) {
  if (!state.images.has(reference)) {
    const loading = api(resultPath(reference), { raw: true }).then((response) => response.blob()).then((blob) => URL.createObjectURL(blob));
    loading.catch(() => state.images.delete(reference));
    state.images.set(reference, loading);
  }
  return state.images.get(reference);
}

function forgetImages() {
  for (const loading of state.images.values()) loading.then((url) => URL.revokeObjectURL(url)).catch(() => {});
  state.images.clear();
}

function renderTranscript(transcript) {
  const box = $("transcript");
  box.replaceChildren();
  for (const message of transcript.messages) {
    const node = renderMessage(message);
    if (node) box.appendChild(node);
  }
  if (transcript.status === "failed" || transcript.status === "abandoned") {
    box.appendChild(element("div", { className: "msg failed", text: `The last turn ${transcript.status}: ${transcript.error || ""}` }));
  }
  const live = state.live && state.live.session === state.session ? state.live : null;
  // A run still streaming is not stored yet: a refresh meanwhile (the chat was just opened) keeps its lines.
  if (live) box.append(...live.nodes);
  else if (!transcript.messages.length) box.appendChild(element("p", { className: "muted empty", text: "No messages yet." }));
  $("chat-meta").textContent = transcript.turns ? `${transcript.turns} turn${transcript.turns === 1 ? "" : "s"}` : "new chat";
  box.scrollTop = box.scrollHeight;
}

// A turn's progress, live. A message, and a decision that resumes a held step, are sent with Accept:
// text/event-stream, and the server answers with the run's events as they happen (tool calls, results, offloads,
// approval requests, the model replying), then "done" with the same JSON a plain POST returns. The events are shown
// as small lines under the message (or at the end of the chat, for a decision); the stored conversation replaces them
// when the turn ends. EventSource cannot send the bearer header (nor POST), so fetch reads the stream.

async function streamTurn(path, json, onEvent) {
  const response = await fetch(path, {
    method: "POST",
    headers: { Authorization: `Bearer ${state.token}`, "Content-Type": "application/json", Accept: "text/event-stream" },
    body: JSON.stringify(json),
  });
  const type = response.headers.get("Content-Type") || "";
  if (!response.ok || !type.startsWith("text/event-stream")) {
    const body = await response.json().catch(() => null);
    if (!response.ok) throw new ApiError(response.status, body);
    return body;  // a server that answers JSON anyway
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = parseEvent(buffer.slice(0, end));
      buffer = buffer.slice(end + 2);
      if (!event) continue;
      if (event.kind === "done") return event.data;
      if (event.kind === "error") throw new ApiError(event.data.status, event.data);
      onEvent(event);
    }
  }
  throw new ApiError(0, { detail: "the connection closed before the turn ended (the chat shows what was stored)" });
}

// One server-sent event: "event:" and "data:" lines; comments (keep-alives) and frames without data are skipped.
function parseEvent(frame) {
  let kind = "message";
  const data = [];
  for (const line of frame.split("\n")) {
    const colon = line.indexOf(":");
    if (colon === 0) continue;
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "event") kind = value;
    else if (field === "data") data.push(value);
  }
  return data.length ? { kind, data: JSON.parse(data.join("\n")) } : null;
}

// The lines of one run: under the message being sent (`text`), or, for a decision (no text), at the end of the chat.
function startProgress(text = null) {
  const box = $("transcript");
  for (const empty of box.querySelectorAll(".empty")) empty.remove();
  const nodes = [];
  if (text !== null) {
    nodes.push(element("div", { className: "msg user sending", testid: "msg-user-sending" }, [
      element("div", { className: "who", text: "you" }),
      element("div", { text }),
    ]));
  }
  const list = element("div", { className: "progress", testid: "progress", attrs: { role: "log", "aria-label": "What the agent is doing" } });
  nodes.push(list);
  box.append(...nodes);
  box.scrollTop = box.scrollHeight;
  state.live = { session: state.session, list, nodes, lines: new Map(), turn: null };
  return state.live;
}

// The run ended (or failed): its lines go when the stored conversation is shown next.
function endProgress(progress) {
  if (state.live === progress) state.live = null;
}

// One line per tool call (updated as it runs, returns and is stored), per approval request, and one for the reply.
function progressLine(progress, key, kind, icon) {
  let line = progress.lines.get(key);
  if (!line) {
    line = {
      node: element("div", { className: `event progress-line ${kind}`, testid: "progress-event", attrs: { "data-kind": kind } }),
      icon: element("span", { className: "event-icon", text: icon, attrs: { "aria-hidden": "true" } }),
      body: element("div", { className: "event-body" }),
      state: element("span", { className: "progress-state" }),
    };
    line.node.append(line.icon, line.body);
    progress.lines.set(key, line);
    progress.list.appendChild(line.node);
  }
  return line;
}

function showProgress(progress, event) {
  if (progress.session !== state.session || !progress.list.isConnected) return;  // another chat is open now
  const data = event.data;
  const call = (line) => line.body.replaceChildren(
    element("strong", { text: data.tool_name }),
    element("code", { text: `(${data.arguments || ""})` }),
    " ", line.state,
  );
  const settle = (line, kind, text) => {
    line.node.classList.remove("running");
    line.node.classList.add(kind);
    line.node.dataset.kind = kind;
    line.state.textContent = text;
  };
  if (event.kind === "turn") {
    progress.turn = data.turn;
    setStatus(`The agent is working on turn ${data.turn}…`);
  } else if (event.kind === "tool_call") {
    const line = progressLine(progress, `call:${data.tool_call_id}`, "tool_call", "⚙");
    line.node.classList.add("running");
    line.state.textContent = "running…";
    call(line);
  } else if (event.kind === "tool_result") {
    const line = progressLine(progress, `call:${data.tool_call_id}`, "tool_call", "⚙");
    if (!line.body.childNodes.length) call(line);
    settle(line, data.error ? "tool_failed" : "tool_result", data.error ? "failed" : `returned ${formatBytes(data.size)}`);
  } else if (event.kind === "offloaded") {
    const line = progressLine(progress, `call:${data.tool_call_id}`, "tool_call", "⚙");
    if (!line.body.childNodes.length) call(line);
    const size = data.size === null || data.size === undefined ? "" : `${formatBytes(data.size)} `;
    settle(line, "offloaded", `${size}stored in ${data.references.length} result${data.references.length === 1 ? "" : "s"}`);
    line.node.title = data.references.join("\n");
  } else if (event.kind === "approval_requested") {
    const line = progressLine(progress, `approval:${data.request_id}`, "approval_requested", "◷");
    line.body.replaceChildren(
      element("strong", { text: data.tool_name }),
      element("code", { text: `(${data.arguments || ""})` }),
      " waits for approval",
    );
  } else if (event.kind === "reply") {
    const line = progressLine(progress, "reply", "reply", "✎");
    line.node.classList.add("running");
    line.body.textContent = "The model is writing its answer…";
  } else if (event.kind === "dropped") {
    progressLine(progress, "dropped", "dropped", "…").body.textContent = `${data.count} progress update(s) skipped`;
  }
  const box = $("transcript");
  box.scrollTop = box.scrollHeight;
}

async function send(event) {
  event.preventDefault();
  const text = $("message").value.trim();
  if (!text || !state.signedIn) return;
  $("send").disabled = true;
  setStatus("The agent is working…");
  const progress = startProgress(text);
  $("message").value = "";  // it is shown in the chat now; put back below if the turn fails
  try {
    const turn = await streamTurn(sessionPath("/messages"), { text }, (update) => showProgress(progress, update));
    setStatus(turn.status === "approval_required"
      ? `Turn ${turn.turn} waits for ${turn.pending.length} approval(s): see Pending approvals.`
      : `Turn ${turn.turn} completed; ${turn.new_results.length} result(s) stored.`);
  } catch (error) {
    if (!$("message").value) $("message").value = text;
    const code = error.body && error.body.error;
    if (code === "approval_pending") setStatus("Decide the pending approvals first.", true);
    else if (code === "session_busy") setStatus("This chat is busy with another message; try again.", true);
    else if (code === "quota_exceeded") setStatus(`Not sent: ${error.message}`, true);
    else setStatus(`Error: ${error.message}`, true);
  } finally {
    $("send").disabled = false;
    endProgress(progress);
    await Promise.all([refreshAll(), loadSessions()]);
  }
}

// Approvals

function renderApproval(request) {
  const original = JSON.stringify(request.arguments, null, 2);
  const editor = element("textarea", { text: original, testid: "approval-arguments", attrs: { rows: "5", spellcheck: "false", "aria-label": "Arguments (JSON)" } });
  const reason = element("input", { testid: "approval-reason", attrs: { placeholder: "reason (optional; shown to the model on deny)", "aria-label": "Reason" } });
  const problem = element("div", { className: "problem", testid: "approval-problem" });
  const decide = async (approved) => {
    let argumentsEdited = null;
    if (approved && editor.value.trim() !== original.trim()) {
      try { argumentsEdited = JSON.parse(editor.value); } catch (error) { problem.textContent = "The arguments are not valid JSON."; return; }
    }
    card.querySelectorAll("button").forEach((button) => { button.disabled = true; });
    setStatus(approved ? "Approved; the agent continues…" : "Denied; the agent continues…");
    // The last decision resumes the chat: its run streams like a message's turn (the approved call, its result, the
    // model's answer), shown as lines at the end of the chat until the stored conversation replaces them.
    const progress = startProgress();
    try {
      const outcome = await streamTurn(
        sessionPath(`/approvals/${encodeURIComponent(request.request_id)}`),
        { approved, arguments: argumentsEdited, reason: reason.value || null },
        (update) => showProgress(progress, update),
      );
      if (outcome.resumed) setStatus(`Turn ${outcome.resumed.turn} ${outcome.resumed.status}.`);
      else if (outcome.pending.length) setStatus(`${outcome.pending.length} approval(s) still pending.`);
      else setStatus("Decision recorded; another request is continuing the chat.");
    } catch (error) {
      endProgress(progress);
      progress.list.remove();
      if (progress.turn === null) {
        // Refused before anything ran (expired, decided elsewhere, an invalid edit): the card stays, to try again.
        problem.textContent = error.message;
        card.querySelectorAll("button").forEach((button) => { button.disabled = false; });
        return;
      }
      // The decision stands and the chat went on, but the resumed run failed: the chat shows what was stored.
      setStatus(`Error: ${error.message}`, true);
    }
    endProgress(progress);
    await Promise.all([refreshAll(), loadSessions()]);
  };
  const card = element("div", { className: "approval", testid: "approval" }, [
    element("div", { className: "tool", text: request.tool_name }),
    element("div", { className: "muted", text: request.tool_description }),
    editor,
    reason,
    element("div", { className: "actions" }, [
      element("button", { text: "Approve", testid: "approve", attrs: { type: "button" }, onclick: () => decide(true) }),
      element("button", { className: "deny", text: "Deny", testid: "deny", attrs: { type: "button" }, onclick: () => decide(false) }),
    ]),
    problem,
    element("div", { className: "muted", text: `expires ${new Date(request.expires).toLocaleString()}` }),
  ]);
  return card;
}

function renderApprovals() {
  const pending = state.pending;
  $("approval-count").textContent = String(pending.length);
  $("approvals-panel").classList.toggle("waiting", pending.length > 0);
  const box = $("approvals");
  box.replaceChildren();
  if (!pending.length && state.resumable) {
    // The calls are decided, but the run that should have made them (or answered them) failed or never began:
    // continuing runs each once, or gives the model what ran.
    const why = state.status === "approval_required" ? "The decided calls have not finished yet." : "The last turn failed before it finished.";
    box.appendChild(element("p", { className: "muted", text: why }));
    box.appendChild(element("button", { text: "Continue", testid: "continue", attrs: { type: "button" }, onclick: resume }));
  } else if (!pending.length && state.status === "approval_required") {
    // Held, but nothing left to decide: the requests expired. Resuming tells the model so.
    box.appendChild(element("p", { className: "muted", text: "The approval requests expired before anyone decided." }));
    box.appendChild(element("button", { text: "Continue the chat", testid: "resume", attrs: { type: "button" }, onclick: resume }));
  } else if (!pending.length) {
    box.appendChild(element("p", { className: "muted", text: "Nothing waits for approval." }));
  }
  for (const request of pending) box.appendChild(renderApproval(request));
}

async function resume() {
  setStatus("Continuing…");
  try {
    const turn = await api(sessionPath("/resume"), { method: "POST" });
    setStatus(`Turn ${turn.turn} ${turn.status}.`);
  } catch (error) {
    setStatus(`Error: ${error.message}`, true);
  }
  await refreshAll();
}

// Audit trail (read when its panel is open: one request per audit event on the server, so not on every refresh)

function auditSummary(event) {
  const detail = event.detail || {};
  switch (event.event) {
    case "approval.requested": return `asked for ${event.tool_name}`;
    case "approval.decided":
      return `${detail.approved ? "approved" : "denied"} ${event.tool_name}${detail.edited ? " (edited)" : ""}${detail.reason ? `: ${detail.reason}` : ""}`;
    case "approval.executed": return `${event.tool_name} ${detail.error ? "failed" : "ran"}`;
    case "approval.denied": return `${event.tool_name} did not run${detail.reason ? `: ${detail.reason}` : ""}`;
    case "approval.resumed": return `resumed ${detail.calls ?? ""} call(s)`;
    default: return event.tool_name || "";
  }
}

async function loadAudit() {
  const session = state.session;
  if (!session || !state.signedIn) return;
  let events;
  try {
    ({ events } = await api(sessionPath("/audit")));
  } catch (error) {
    $("audit").replaceChildren(element("li", { className: "error", text: `Could not read the audit trail: ${error.message}` }));
    return;
  }
  if (session !== state.session) return;
  $("audit-count").textContent = String(events.length);
  $("audit-count").hidden = false;
  const list = $("audit");
  list.replaceChildren();
  if (!events.length) list.appendChild(element("li", { className: "muted", text: "No approval was asked in this chat." }));
  for (const event of events) {
    list.appendChild(element("li", { testid: "audit-event" }, [
      element("time", { className: "muted", text: new Date(event.at).toLocaleTimeString(), attrs: { datetime: event.at, title: event.at } }),
      element("span", { className: "audit-kind", text: event.event.replace(/^approval\./, "") }),
      element("span", { text: auditSummary(event) }),
      event.actor ? element("span", { className: "muted actor", text: `by ${event.actor}` }) : null,
    ]));
  }
}

// Results and the viewer

function renderResults(results) {
  $("result-count").textContent = String(results.length);
  const list = $("results");
  list.replaceChildren();
  if (!results.length) list.appendChild(element("li", { className: "muted", text: "No results stored yet." }));
  for (const result of results) {
    list.appendChild(element("li", { testid: "result" }, [
      element("span", { className: "kind", text: result.media_type.startsWith("image/") ? "image" : result.kind }),
      element("span", { className: "label", text: `${result.tool_name || "?"} · ${formatBytes(result.size)}` }),
      element("button", {
        className: "secondary", text: "View", testid: "view-result",
        attrs: { title: result.reference, type: "button" }, onclick: () => openResult(result.reference),
      }),
    ]));
  }
}

async function loadResults() {
  const session = state.session;
  if (!session || !state.signedIn) return;
  const { results } = await api(sessionPath("/results"));
  if (session === state.session) renderResults(results);
}

async function openResult(reference) {
  if (!state.viewer) state.returnFocus = document.activeElement;
  if (state.viewer && state.viewer.image) URL.revokeObjectURL(state.viewer.image);
  state.viewer = { reference, offsets: [0], image: null, midWord: new Set() };
  $("viewer-title").textContent = reference;
  $("viewer").hidden = false;
  $("viewer-close").focus();
  await showPage(0);
}

// Where a page of text is best cut so the next one starts where a reader can follow: after the last newline in the
// page's second half, else after the last space or tab in its last quarter, else (one very long word) at its end.
function readableEnd(bytes) {
  const newline = bytes.lastIndexOf(0x0a);
  if (newline >= bytes.length / 2) return newline + 1;
  for (let index = bytes.length - 1; index >= (bytes.length * 3) / 4; index--) {
    if (bytes[index] === 0x20 || bytes[index] === 0x09) return index + 1;
  }
  return bytes.length;
}

async function showPage(offset) {
  const viewer = state.viewer;
  const response = await api(`${resultPath(viewer.reference)}?offset=${offset}&length=${PAGE_BYTES}`, { raw: true });
  if (viewer !== state.viewer) return;
  const total = Number(response.headers.get("X-Result-Size"));
  const mediaType = response.headers.get("X-Result-Media-Type") || "";
  const kind = response.headers.get("X-Result-Kind");
  $("viewer-meta").textContent = `${kind} · ${mediaType} · ${formatBytes(total)}`;
  $("viewer-continued").hidden = true;
  $("viewer-continues").hidden = true;
  if (mediaType.startsWith("image/")) {
    // An image is shown whole: fetched with the bearer header, then shown from a blob URL.
    const whole = await api(resultPath(viewer.reference), { raw: true });
    if (viewer !== state.viewer) return;
    viewer.image = URL.createObjectURL(await whole.blob());
    $("viewer-image").src = viewer.image;
    $("viewer-image").hidden = false;
    $("viewer-text").hidden = true;
    $("viewer-range").textContent = `image, ${total} bytes`;
    $("viewer-prev").disabled = true;
    $("viewer-next").disabled = true;
    return;
  }
  $("viewer-image").hidden = true;
  $("viewer-text").hidden = false;
  const start = Number(response.headers.get("X-Result-Start"));
  const last = response.headers.get("X-Next-Offset") === null;
  let bytes = new Uint8Array(await response.arrayBuffer());
  if (viewer !== state.viewer) return;
  let cutMidWord = false;
  if (kind === "text" && !last) {
    const end = readableEnd(bytes);
    cutMidWord = end === bytes.length;
    bytes = bytes.subarray(0, end);
  }
  const end = start + bytes.length;
  $("viewer-text").textContent = kind === "text" ? new TextDecoder().decode(bytes) : hexPreview(bytes);
  $("viewer-range").textContent = `bytes ${start}–${end} of ${total}`;
  $("viewer-continued").hidden = !viewer.midWord.has(offset);
  $("viewer-continues").hidden = !cutMidWord;
  if (cutMidWord) viewer.midWord.add(end);
  viewer.current = offset;
  viewer.next = last ? null : end;
  $("viewer-text").scrollTop = 0;
  $("viewer-prev").disabled = viewer.offsets.indexOf(offset) <= 0;
  $("viewer-next").disabled = viewer.next === null;
}

function hexPreview(bytes) {
  const lines = [];
  for (let row = 0; row < Math.min(bytes.length, 1024); row += 16) {
    const slice = Array.from(bytes.slice(row, row + 16));
    lines.push(`${row.toString(16).padStart(6, "0")}  ${slice.map((b) => b.toString(16).padStart(2, "0")).join(" ")}`);
  }
  return lines.join("\n");
}

function closeViewer() {
  if (!state.viewer) return;
  if (state.viewer.image) URL.revokeObjectURL(state.viewer.image);
  state.viewer = null;
  $("viewer").hidden = true;
  const back = state.returnFocus;
  state.returnFocus = null;
  if (back && document.contains(back)) back.focus();
}

// Login links: /#token=...&session=...
// A link never replaces a different stored token by itself: anyone can send a link with their own token, and what
// this user then types and approves would go to that account (login CSRF). It asks first, unless the stored token no
// longer signs anyone in: then there is no account to protect, and the link signs in.

async function applyLoginLink() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  const token = (fragment.get("token") || "").trim();
  const session = (fragment.get("session") || "").trim();
  // Keep the token out of the URL bar, the history and bookmarks, whatever is decided below.
  if (fragment.has("token")) history.replaceState(null, "", location.pathname + location.search);
  const stored = localStorage.getItem("offload-token") || "";
  if (token && stored && token !== stored) {
    if (await tokenAccepted(stored)) {
      offerSwitch(token, session);
      return false;
    }
    localStorage.removeItem("offload-token");
  }
  if (token) $("token").value = token;
  if (session) $("session").value = session;
  return Boolean(token || session);
}

// Whether the server still knows a token (anything but a 401 counts as yes: when in doubt, the page asks).
async function tokenAccepted(token) {
  try {
    const response = await fetch("/api/me", { headers: { Authorization: `Bearer ${token}` } });
    return response.status !== 401;
  } catch (error) {
    return true;
  }
}

function offerSwitch(token, session) {
  state.offered = { token, session };
  $("switch-user-detail").textContent = "";
  $("switch-user").hidden = false;
  $("switch-user-keep").focus();
  // Name the link's tenant so the choice is an informed one (/api/me reads, it changes nothing).
  fetch("/api/me", { headers: { Authorization: `Bearer ${token}` } })
    .then((response) => (response.ok ? response.json() : null))
    .then((me) => {
      if (!state.offered || state.offered.token !== token) return;
      $("switch-user-detail").textContent = me ? `The link is for tenant ${me.tenant}.` : "The link's token is not valid here.";
    })
    .catch(() => {});
}

function answerSwitch(accepted) {
  const offered = state.offered;
  state.offered = null;
  $("switch-user").hidden = true;
  if (!offered || !accepted) return;
  $("token").value = offered.token;
  if (offered.session) $("session").value = offered.session;
  connect();
}

// Start-up

async function start() {
  $("token").value = localStorage.getItem("offload-token") || "";
  $("session").value = localStorage.getItem("offload-session") || "chat-1";
  // A link opened in this tab while the page is open changes only the fragment: no reload, so check it here too.
  window.addEventListener("hashchange", async () => { if (await applyLoginLink()) connect(); });
  $("switch-user-switch").addEventListener("click", () => answerSwitch(true));
  $("switch-user-keep").addEventListener("click", () => answerSwitch(false));
  $("switch-user").addEventListener("keydown", (event) => { if (event.key === "Escape") answerSwitch(false); });
  $("login").addEventListener("submit", connect);
  $("account-toggle").addEventListener("click", () => {
    const open = document.body.classList.toggle("login-open");
    $("account-toggle").setAttribute("aria-expanded", String(open));
  });
  $("new-chat").addEventListener("click", newChat);
  $("composer").addEventListener("submit", send);
  $("message").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) send(event);
  });
  $("refresh-results").addEventListener("click", () => loadResults().catch((error) => setStatus(`Error: ${error.message}`, true)));
  $("audit-panel").addEventListener("toggle", () => { if ($("audit-panel").open) loadAudit(); });
  $("viewer-close").addEventListener("click", closeViewer);
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && state.viewer) {
      event.preventDefault();
      closeViewer();
    }
  });
  $("viewer-next").addEventListener("click", () => {
    const viewer = state.viewer;
    if (viewer && viewer.next !== null) { viewer.offsets.push(viewer.next); showPage(viewer.next); }
  });
  $("viewer-prev").addEventListener("click", () => {
    const viewer = state.viewer;
    if (viewer && viewer.offsets.length > 1) { viewer.offsets.pop(); showPage(viewer.offsets[viewer.offsets.length - 1]); }
  });
  for (const suggestion of SUGGESTIONS) {
    $("suggestions").appendChild(element("button", { text: suggestion, attrs: { type: "button" }, onclick: () => { $("message").value = suggestion; $("message").focus(); } }));
  }
  showModel().catch(() => { $("model-badge").textContent = "server unreachable"; });
  await applyLoginLink();
  if ($("token").value) connect();
}

start();
