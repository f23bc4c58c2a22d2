// The page: the explorer over HTTP (JSON endpoints and server-sent events), see explorer.js.
// The URL carries the state (text, source, head, ablate, sampling), so a link reproduces the view.
import { httpTransport, mountExplorer } from "./explorer.js";

const params = new URLSearchParams(window.location.search);
const ablate = (params.get("ablate") || "").split(",").filter(Boolean).map((k) => {
  const [site, layer, head] = k.split(":");
  return { site, layer: +layer, head: +head };
});
mountExplorer(document.getElementById("app"), httpTransport(""), {
  text: params.get("text") || "",
  source: params.get("source") || "",
  head: params.get("head") || "", // site:layer:head, e.g. decoder:1:0
  ablate, // site:layer:head,site:layer:head
  sampling: Object.fromEntries(params), // the page reads its sampling settings from these
  syncUrl: true,
});
