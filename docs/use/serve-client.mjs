// A branchgate client in plain JavaScript (Node >= 18: global fetch, no npm packages).
// Start the server first:  branchgate serve --pre pretrained:pre --read pretrained:read
// Then:                    BRANCHGATE_URL=http://127.0.0.1:8000 node serve-client.mjs
const base = process.env.BRANCHGATE_URL ?? "http://127.0.0.1:8000";

async function call(path, body) {
  const response = await fetch(base + path, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const answer = await response.json();
  if (!response.ok) {
    // every error is {"error": {"field": ..., "message": ...}}
    throw new Error(`${path} ${response.status} ${answer.error.field ?? ""}: ${answer.error.message}`);
  }
  return answer;
}

// Before searching: which of the planner's sub-queries to expand.
const decision = {
  "state": {"root_query": "Why are honeybee colonies collapsing?", "frame_query": "", "parent_goal": "", "retained": [], "depth": 0},
  "candidates": [
    {"query": "neonicotinoid pesticide field studies on bees", "goal": "pesticide exposure"},
    {"query": "varroa mite parasite load in hives", "goal": "parasites"},
    {"query": "honey prices by country 2023", "goal": "market"}
  ]
};
const selected = await call("/v1/select", decision);
for (const i of selected.kept) console.log(`search: ${decision.candidates[i].query}`);

// After a search: which of its results to read (fetch, scrape, summarise).
const search = {
  "state": {"root_query": "Why are honeybee colonies collapsing?", "query": "varroa mite parasite load in hives", "goal": "parasites", "read": [], "depth": 1},
  "hits": [
    {"title": "Varroa destructor and deformed wing virus", "snippet": "Mites transmit viruses that weaken colonies over winter.", "id": "https://example.org/varroa", "rank": 0},
    {"title": "Beekeeping supplies sale", "snippet": "Hive tools and suits at half price this week.", "id": "https://example.org/shop", "rank": 1},
    {"title": "Miticide resistance in apiaries", "snippet": "Treatments lose effect as mite populations adapt.", "id": "https://example.org/miticide", "rank": 2}
  ]
};
const read = await call("/v1/read", search);
for (const i of read.kept) console.log(`read: ${search.hits[i].title}`);
console.log(`p_keep: ${selected.p_keep.map((p) => p.toFixed(3)).join(" ")} | ${read.p_keep.map((p) => p.toFixed(3)).join(" ")}`);
