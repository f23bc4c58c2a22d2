// The page: the explorer over HTTP (JSON endpoints and server-sent events), see explorer.js.
import { httpTransport, mountExplorer } from "./explorer.js";

const params = new URLSearchParams(window.location.search);
mountExplorer(document.getElementById("app"), httpTransport(""), {
  text: params.get("text") || "",
  source: params.get("source") || "",
  head: params.get("head") || "", // site:layer:head, e.g. decoder:1:0
});
