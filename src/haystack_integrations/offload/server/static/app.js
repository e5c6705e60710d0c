// The reference server's page: chat, pending approvals, and a paged viewer for offloaded results.
// Everything model- or tool-written is inserted with textContent, never as HTML.
"use strict";

const PAGE_BYTES = 4096;
const SUGGESTIONS = [
  "Research solar panels, dump the invoices table and chart revenue",
  "Check the logs of billing, search and payroll",
  "Send an invoice to Initech for 250 EUR",
  "Read back the search results for \"result 7\"",
  "List my results",
];

const state = { token: "", session: "", viewer: null, status: null, attempt: 0, offered: null };
const $ = (id) => document.getElementById(id);

function element(tag, options = {}, children = []) {
  const node = document.createElement(tag);
  if (options.className) node.className = options.className;
  if (options.text !== undefined && options.text !== null) node.textContent = options.text;
  if (options.testid) node.dataset.testid = options.testid;
  for (const [name, value] of Object.entries(options.attrs || {})) node.setAttribute(name, value);
  if (options.onclick) node.addEventListener("click", options.onclick);
  for (const child of children) if (child) node.appendChild(child);
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
  const headers = Object.assign({ Authorization: `Bearer ${state.token}` }, options.headers || {});
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

function setStatus(text, bad = false) {
  $("status").textContent = text;
  $("status").classList.toggle("bad", bad);
}

function formatBytes(size) {
  if (size < 1024) return `${size} B`;
  if (size < 1024 * 1024) return `${(size / 1024).toFixed(1)} KB`;
  return `${(size / 1024 / 1024).toFixed(1)} MB`;
}

// Model badge: a scripted model says so, in the page as in the logs.
async function showModel() {
  const health = await fetch("/api/health").then((response) => response.json());
  const badge = $("model-badge");
  badge.textContent = health.scripted ? `SCRIPTED · ${health.model}` : `model: ${health.model}`;
  badge.classList.toggle("scripted", health.scripted);
}

async function connect(event) {
  if (event) event.preventDefault();
  const attempt = ++state.attempt;
  state.token = $("token").value.trim();
  state.session = $("session").value.trim();
  $("login-error").textContent = "";
  try {
    const me = await api("/api/me");
    if (attempt !== state.attempt) return;  // a newer sign-in (e.g. "Switch") started meanwhile: it wins
    localStorage.setItem("offload-token", state.token);
    localStorage.setItem("offload-session", state.session);
    $("tenant-badge").textContent = `tenant: ${me.tenant}`;
    $("tenant-badge").hidden = false;
    $("message").disabled = false;
    $("send").disabled = false;
    await refreshAll();
  } catch (error) {
    if (attempt !== state.attempt) return;
    $("login-error").textContent = error.status === 401 ? "Unknown token." : error.message;
  }
}

async function refreshAll() {
  await loadTranscript();
  await Promise.all([loadApprovals(), loadResults()]);
}

// Transcript

function renderMessage(message) {
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
      children.push(element("div", { className: "call", text: `→ ${call.tool_name}(${JSON.stringify(call.arguments)})` }));
    }
    return element("div", { className: "msg assistant", testid: "msg-assistant" }, children);
  }
  const result = message.tool_result;
  if (!result) return null;
  const refs = element("div", { className: "offloaded" });
  for (const reference of result.offloaded) {
    refs.appendChild(element("button", {
      className: "secondary", text: "open stored result", testid: "open-offloaded",
      attrs: { title: reference }, onclick: () => openResult(reference),
    }));
  }
  return element("div", { className: `msg tool${result.error ? " error" : ""}`, testid: "msg-tool" }, [
    element("div", { className: "who", text: `${result.tool_name} result${result.offloaded.length ? " · offloaded" : ""}` }),
    element("div", { text: result.text }),
    result.offloaded.length ? refs : null,
  ]);
}

async function loadTranscript() {
  const transcript = await api(sessionPath("/messages"));
  state.status = transcript.status;
  const box = $("transcript");
  box.replaceChildren();
  for (const message of transcript.messages) {
    const node = renderMessage(message);
    if (node) box.appendChild(node);
  }
  if (transcript.status === "failed" || transcript.status === "abandoned") {
    box.appendChild(element("div", { className: "msg failed", text: `The last turn ${transcript.status}: ${transcript.error || ""}` }));
  }
  if (!transcript.messages.length) box.appendChild(element("p", { className: "muted empty", text: "No messages yet." }));
  box.scrollTop = box.scrollHeight;
}

async function send(event) {
  event.preventDefault();
  const text = $("message").value.trim();
  if (!text || !state.token) return;
  $("send").disabled = true;
  setStatus("The agent is working…");
  try {
    const turn = await api(sessionPath("/messages"), { method: "POST", json: { text } });
    $("message").value = "";
    setStatus(turn.status === "approval_required"
      ? `Turn ${turn.turn} waits for ${turn.pending.length} approval(s): see the panel on the right.`
      : `Turn ${turn.turn} completed; ${turn.new_results.length} result(s) stored.`);
  } catch (error) {
    if (error.body.error === "approval_pending") setStatus("Decide the pending approvals first.", true);
    else if (error.body.error === "session_busy") setStatus("This chat is busy with another message; try again.", true);
    else setStatus(`Error: ${error.message}`, true);
  } finally {
    $("send").disabled = false;
    await refreshAll();
  }
}

// Approvals

function renderApproval(request) {
  const original = JSON.stringify(request.arguments, null, 2);
  const editor = element("textarea", { text: original, testid: "approval-arguments", attrs: { rows: "5", spellcheck: "false" } });
  const reason = element("input", { testid: "approval-reason", attrs: { placeholder: "reason (optional; shown to the model on deny)" } });
  const problem = element("div", { className: "problem", testid: "approval-problem" });
  const decide = async (approved) => {
    let argumentsEdited = null;
    if (approved && editor.value.trim() !== original.trim()) {
      try { argumentsEdited = JSON.parse(editor.value); } catch (error) { problem.textContent = "The arguments are not valid JSON."; return; }
    }
    card.querySelectorAll("button").forEach((button) => { button.disabled = true; });
    setStatus(approved ? "Approved; the agent continues…" : "Denied; the agent continues…");
    try {
      const outcome = await api(sessionPath(`/approvals/${encodeURIComponent(request.request_id)}`), {
        method: "POST", json: { approved, arguments: argumentsEdited, reason: reason.value || null },
      });
      if (outcome.resumed) setStatus(`Turn ${outcome.resumed.turn} ${outcome.resumed.status}.`);
      else if (outcome.pending.length) setStatus(`${outcome.pending.length} approval(s) still pending.`);
      else setStatus("Decision recorded; another request is continuing the chat.");
    } catch (error) {
      problem.textContent = error.message;
      card.querySelectorAll("button").forEach((button) => { button.disabled = false; });
      return;
    }
    await refreshAll();
  };
  const card = element("div", { className: "approval", testid: "approval" }, [
    element("div", { className: "tool", text: request.tool_name }),
    element("div", { className: "muted", text: request.tool_description }),
    editor,
    reason,
    element("div", { className: "actions" }, [
      element("button", { text: "Approve", testid: "approve", onclick: () => decide(true) }),
      element("button", { className: "deny", text: "Deny", testid: "deny", onclick: () => decide(false) }),
    ]),
    problem,
    element("div", { className: "muted", text: `expires ${new Date(request.expires).toLocaleString()}` }),
  ]);
  return card;
}

async function loadApprovals() {
  const { pending } = await api(sessionPath("/approvals"));
  $("approval-count").textContent = String(pending.length);
  const box = $("approvals");
  box.replaceChildren();
  if (!pending.length && state.status === "approval_required") {
    // Held, but nothing left to decide: the requests expired. Resuming tells the model so.
    box.appendChild(element("p", { className: "muted", text: "The approval requests expired before anyone decided." }));
    box.appendChild(element("button", { text: "Continue the chat", testid: "resume", onclick: resume }));
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

// Results and the viewer

async function loadResults() {
  const { results } = await api(sessionPath("/results"));
  $("result-count").textContent = String(results.length);
  const list = $("results");
  list.replaceChildren();
  if (!results.length) list.appendChild(element("li", { className: "muted", text: "No results stored yet." }));
  for (const result of results) {
    list.appendChild(element("li", { testid: "result" }, [
      element("span", { className: "kind", text: result.media_type.startsWith("image/") ? "image" : result.kind }),
      element("span", { text: `${result.tool_name || "?"} · ${formatBytes(result.size)}` }),
      element("button", {
        className: "secondary", text: "View", testid: "view-result",
        attrs: { title: result.reference }, onclick: () => openResult(result.reference),
      }),
    ]));
  }
}

async function openResult(reference) {
  state.viewer = { reference, offsets: [0], image: null };
  $("viewer-title").textContent = reference;
  $("viewer").hidden = false;
  await showPage(0);
}

async function showPage(offset) {
  const viewer = state.viewer;
  const response = await api(`${sessionPath(`/results/${encodeURIComponent(viewer.reference)}`)}?offset=${offset}&length=${PAGE_BYTES}`, { raw: true });
  const total = Number(response.headers.get("X-Result-Size"));
  const mediaType = response.headers.get("X-Result-Media-Type") || "";
  const kind = response.headers.get("X-Result-Kind");
  $("viewer-meta").textContent = `${kind} · ${mediaType} · ${formatBytes(total)}`;
  if (mediaType.startsWith("image/")) {
    // An image is shown whole: fetched with the bearer header, then shown from a blob URL.
    const whole = await api(sessionPath(`/results/${encodeURIComponent(viewer.reference)}`), { raw: true });
    if (viewer.image) URL.revokeObjectURL(viewer.image);
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
  const end = Number(response.headers.get("X-Result-End"));
  const next = response.headers.get("X-Next-Offset");
  $("viewer-text").textContent = kind === "text" ? await response.text() : hexPreview(new Uint8Array(await response.arrayBuffer()));
  $("viewer-range").textContent = `bytes ${start}–${end} of ${total}`;
  viewer.current = offset;
  viewer.next = next === null ? null : Number(next);
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
  if (state.viewer && state.viewer.image) URL.revokeObjectURL(state.viewer.image);
  state.viewer = null;
  $("viewer").hidden = true;
}

// Login links: /#token=...&session=...
// A link never replaces a different stored token by itself: anyone can send a link with their own token, and what
// this user then types and approves would go to that account (login CSRF). It asks first.

function applyLoginLink() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  const token = (fragment.get("token") || "").trim();
  const session = (fragment.get("session") || "").trim();
  // Keep the token out of the URL bar, the history and bookmarks, whatever is decided below.
  if (fragment.has("token")) history.replaceState(null, "", location.pathname + location.search);
  const stored = localStorage.getItem("offload-token") || "";
  if (token && stored && token !== stored) {
    offerSwitch(token, session);
    return false;
  }
  if (token) $("token").value = token;
  if (session) $("session").value = session;
  return Boolean(token || session);
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

function start() {
  $("token").value = localStorage.getItem("offload-token") || "";
  $("session").value = localStorage.getItem("offload-session") || "chat-1";
  applyLoginLink();
  // A link opened in this tab while the page is open changes only the fragment: no reload, so check it here too.
  window.addEventListener("hashchange", () => { if (applyLoginLink()) connect(); });
  $("switch-user-switch").addEventListener("click", () => answerSwitch(true));
  $("switch-user-keep").addEventListener("click", () => answerSwitch(false));
  $("switch-user").addEventListener("keydown", (event) => { if (event.key === "Escape") answerSwitch(false); });
  $("login").addEventListener("submit", connect);
  $("new-chat").addEventListener("click", () => {
    $("session").value = `chat-${Date.now().toString(36)}`;
    connect();
  });
  $("composer").addEventListener("submit", send);
  $("message").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) send(event);
  });
  $("refresh-results").addEventListener("click", loadResults);
  $("viewer-close").addEventListener("click", closeViewer);
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
  if ($("token").value) connect();
}

start();
