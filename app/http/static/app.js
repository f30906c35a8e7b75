// detstream live page: one tile per source, its latest annotated picture and its state.
// Polls /api/sources once a second and each tile's snapshot at http.view_fps; no libraries, no build step.
"use strict";

const grid = document.getElementById("grid");
const summary = document.getElementById("summary");
const errorLine = document.getElementById("error");
const back = document.getElementById("back");
const tiles = new Map();      // id -> {root, img, state, stats, reason, loading, retryAt, attempt}
let viewFps = 5;
let selected = null;

function element(tag, className, parent) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (parent) parent.appendChild(node);
  return node;
}

function makeTile(id) {
  const root = element("section", "tile", grid);
  root.dataset.source = id;
  const img = element("img", "picture", root);
  img.alt = "live picture of " + id;
  const bar = element("div", "bar", root);
  const name = element("span", "name", bar);
  name.textContent = id;
  const state = element("span", "state", bar);
  const stats = element("div", "stats", root);
  const reason = element("div", "reason", root);
  const tile = {root, img, state, stats, reason, loading: false, retryAt: null, attempt: -1};
  img.addEventListener("load", () => { tile.loading = false; });
  img.addEventListener("error", () => { tile.loading = false; });
  root.addEventListener("click", () => select(selected === id ? null : id));
  tiles.set(id, tile);
  return tile;
}

function select(id) {
  selected = id;
  grid.classList.toggle("single", id !== null);
  back.hidden = id === null;
  for (const [tid, tile] of tiles) tile.root.hidden = id !== null && tid !== id;
}
back.addEventListener("click", () => select(null));

function render(source) {
  const tile = tiles.get(source.id) || makeTile(source.id);
  tile.root.dataset.state = source.state;
  tile.state.className = "state " + source.state;
  if (source.state === "reconnecting" && source.retry_in_s !== null && source.attempt !== tile.attempt) {
    tile.attempt = source.attempt;
    tile.retryAt = Date.now() + source.retry_in_s * 1000;
  }
  let label = source.state;
  if (source.state === "reconnecting" && tile.retryAt !== null) {
    label += " (retry in " + Math.max(0, (tile.retryAt - Date.now()) / 1000).toFixed(1) + " s)";
  }
  tile.state.textContent = label;
  tile.stats.textContent = source.fps.toFixed(1) + " fps · " + source.published + " published · " +
    source.dropped + " dropped · p50 " + source.p50_ms.toFixed(0) + " ms · p99 " + source.p99_ms.toFixed(0) + " ms";
  tile.reason.textContent = source.state === "running" ? source.url : source.reason;
}

async function refresh() {
  try {
    const response = await fetch("/api/sources", {cache: "no-store"});
    if (!response.ok) throw new Error("HTTP " + response.status);
    const body = await response.json();
    viewFps = body.view_fps;
    const seen = new Set();
    for (const source of body.sources) { render(source); seen.add(source.id); }
    for (const [id, tile] of tiles) {
      if (!seen.has(id)) { tile.root.remove(); tiles.delete(id); if (selected === id) select(null); }
    }
    summary.textContent = body.sources.length + " of " + body.capacity + " sources";
    errorLine.hidden = true;
  } catch (err) {
    errorLine.textContent = "cannot reach detstream: " + err.message;
    errorLine.hidden = false;
  }
}

function pollPictures() {
  for (const [id, tile] of tiles) {
    if (tile.loading || tile.root.hidden) continue;
    tile.loading = true;
    tile.img.src = "/api/sources/" + encodeURIComponent(id) + "/snapshot.jpg?t=" + Date.now();
  }
  setTimeout(pollPictures, 1000 / viewFps);
}

refresh();
setInterval(refresh, 1000);
pollPictures();
