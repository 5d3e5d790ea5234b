// Runs the Applier view's script (view.js) under Node against a status document, with a minimal DOM:
//   node view_smoke.js VIEW_JS STATUS_JSON [CLICK_ID RESUBMIT_JSON RESUBMIT_STATUS STATUS_AFTER_JSON]
// Prints {"error": ..., "shown": ..., "text": ..., "buttons": ...} as JSON. With the four more arguments, it then
// clicks the Resubmit button of exception CLICK_ID (the confirm answered yes), answers the POST with RESUBMIT_JSON
// and RESUBMIT_STATUS, and the redraw's api/status with STATUS_AFTER_JSON; "posted", "confirms", "result" and
// "buttons_after" tell what followed. Every document is what the real API answered (the test captures them).
// A stand-in for the browser test still to come: it proves the script draws real documents without throwing.
"use strict";
const fs = require("fs");
const vm = require("vm");

class Node {
  constructor(tag) {
    this.tag = tag; this.childNodes = []; this.attributes = {}; this.hidden = false; this.style = {}; this.className = "";
    this._text = ""; this.listeners = {}; this.disabled = false;
  }
  set textContent(v) { this._text = v; this.childNodes = []; }
  get textContent() { return this._text + this.childNodes.map((c) => c.textContent).join(" "); }
  append(...nodes) { this.childNodes.push(...nodes); }
  replaceChildren(...nodes) { this._text = ""; this.childNodes = nodes; }
  setAttribute(k, v) { this.attributes[k] = String(v); }
  addEventListener(type, fn) { (this.listeners[type] ??= []).push(fn); }
  click() { return Promise.all((this.listeners.click || []).map((fn) => fn({ target: this }))); }
  createTHead() { return this._child("thead"); }
  createTBody() { return this._child("tbody"); }
  insertRow() { return this._child("tr"); }
  insertCell() { return this._child("td"); }
  _child(tag) { const n = new Node(tag); this.append(n); return n; }
}

const [viewJs, statusJson, clickId, resubmitJson, resubmitStatus, afterJson] = process.argv.slice(2);
const ids = {};
const document = {
  getElementById: (id) => (ids[id] ??= new Node("#" + id)),
  createElement: (tag) => new Node(tag),
  createElementNS: (_ns, tag) => new Node(tag),
};
let status = fs.readFileSync(statusJson, "utf8");
const posted = [];
const fetch = async (url, options = {}) => {
  if (url === "api/status" && !options.method) return { ok: true, status: 200, json: async () => JSON.parse(status) };
  if (options.method === "POST" && resubmitJson && /^api\/exceptions\/[^/]+\/resubmit$/.test(url)) {
    posted.push(url);
    status = fs.readFileSync(afterJson, "utf8");  // the store changed (or not): the redraw reads the after document
    const code = Number(resubmitStatus);
    return { ok: code < 300, status: code, statusText: "", json: async () => JSON.parse(fs.readFileSync(resubmitJson, "utf8")) };
  }
  throw new Error("fetched " + (options.method || "GET") + " " + url);
};
const confirms = [];
const confirm = (question) => { confirms.push(question); return true; };
const context = { document, fetch, Node, confirm, setInterval: () => 0, console, encodeURIComponent };
vm.createContext(context);
vm.runInContext(fs.readFileSync(viewJs, "utf8"), context);

function buttons() {
  const found = [];
  const walk = (n) => { if (n.tag === "button") found.push(n); n.childNodes.forEach(walk); };
  Object.values(ids).forEach(walk);
  return found;
}
const text = () => Object.entries(ids).map(([id, n]) => id + ": " + n.textContent).join("\n");

setTimeout(async () => {
  const out = { error: ids.error.hidden ? null : ids.error.textContent, shown: !ids.view.hidden, text: text(),
    buttons: buttons().map((b) => b.attributes["data-exception-id"]) };
  if (resubmitJson) {
    const button = buttons().find((b) => b.attributes["data-exception-id"] === clickId);
    if (button) await button.click();
    await new Promise((resolve) => setTimeout(resolve, 100));
    const result = document.getElementById("resubmit-result");
    Object.assign(out, { posted, confirms, result: result.hidden ? null : result.textContent, text_after: text(),
      buttons_after: buttons().map((b) => b.attributes["data-exception-id"]),
      error_after: ids.error.hidden ? null : ids.error.textContent });
  }
  console.log(JSON.stringify(out));
}, 100);
