// Runs the Applier view's script (view.js) under Node against a status document, with a minimal DOM:
// node view_smoke.js VIEW_JS STATUS_JSON. Prints {"error": ..., "shown": ..., "text": ...} as JSON.
// A stand-in for the browser test still to come: it proves the script draws a real document without throwing.
"use strict";
const fs = require("fs");
const vm = require("vm");

class Node {
  constructor(tag) { this.tag = tag; this.childNodes = []; this.attributes = {}; this.hidden = false; this.className = ""; this._text = ""; }
  set textContent(v) { this._text = v; this.childNodes = []; }
  get textContent() { return this._text + this.childNodes.map((c) => c.textContent).join(" "); }
  append(...nodes) { this.childNodes.push(...nodes); }
  replaceChildren(...nodes) { this._text = ""; this.childNodes = nodes; }
  setAttribute(k, v) { this.attributes[k] = String(v); }
  createTHead() { return this._child("thead"); }
  createTBody() { return this._child("tbody"); }
  insertRow() { return this._child("tr"); }
  insertCell() { return this._child("td"); }
  _child(tag) { const n = new Node(tag); this.append(n); return n; }
}

const [viewJs, statusJson] = process.argv.slice(2);
const ids = {};
const document = {
  getElementById: (id) => (ids[id] ??= new Node("#" + id)),
  createElement: (tag) => new Node(tag),
  createElementNS: (_ns, tag) => new Node(tag),
};
const body = fs.readFileSync(statusJson, "utf8");
const fetch = async (url) => {
  if (url !== "api/status") throw new Error("fetched " + url);
  return { ok: true, status: 200, json: async () => JSON.parse(body) };
};
const context = { document, fetch, Node, setInterval: () => 0, console };
vm.createContext(context);
vm.runInContext(fs.readFileSync(viewJs, "utf8"), context);
setTimeout(() => {
  const text = Object.entries(ids).map(([id, n]) => id + ": " + n.textContent).join("\n");
  console.log(JSON.stringify({ error: ids.error.hidden ? null : ids.error.textContent, shown: !ids.view.hidden, text }));
}, 100);
