// The client against a real `branchgate serve` (BRANCHGATE_URL; started by tests/test_js_client.py), and every
// answer checked against the live /openapi.json: the schema of its path's 200/201 response.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { BranchgateClient, BranchgateError, gateUrls } from "../dist/index.js";

const baseUrl = process.env.BRANCHGATE_URL;
assert.ok(baseUrl, "set BRANCHGATE_URL to a running branchgate serve (with --pre and --read)");
const client = new BranchgateClient({ baseUrl });
const spec = await (await fetch(`${baseUrl}/openapi.json`)).json();

/** The errors of `value` against a JSON schema of the spec ($ref, type, const, enum, required, properties,
 * items, anyOf/oneOf, additionalProperties as a schema); [] when it conforms. */
function check(value, schema, where = "$") {
  if (schema.$ref) return check(value, spec.components.schemas[schema.$ref.split("/").pop()], where);
  const alternatives = schema.anyOf ?? schema.oneOf;
  if (alternatives) {
    return alternatives.some((s) => check(value, s, where).length === 0) ? [] : [`${where}: matches none of anyOf`];
  }
  if ("const" in schema && value !== schema.const) return [`${where}: not ${JSON.stringify(schema.const)}`];
  if (schema.enum && !schema.enum.includes(value)) return [`${where}: not one of ${schema.enum}`];
  const types = { null: value === null, boolean: typeof value === "boolean", string: typeof value === "string",
    integer: Number.isInteger(value), number: typeof value === "number", array: Array.isArray(value),
    object: value !== null && typeof value === "object" && !Array.isArray(value) };
  if (schema.type && !types[schema.type]) return [`${where}: not ${schema.type}: ${JSON.stringify(value)}`];
  const errors = [];
  if (types.array && schema.items) value.forEach((v, i) => errors.push(...check(v, schema.items, `${where}[${i}]`)));
  if (types.object) {
    for (const key of schema.required ?? []) if (!(key in value)) errors.push(`${where}.${key}: missing`);
    for (const [key, v] of Object.entries(value)) {
      const sub = schema.properties?.[key] ?? (typeof schema.additionalProperties === "object" ? schema.additionalProperties : null);
      if (sub) errors.push(...check(v, sub, `${where}.${key}`));
    }
  }
  return errors;
}

function conforms(answer, path, method, status = "200") {
  const operation = spec.paths[path]?.[method];
  assert.ok(operation, `${method.toUpperCase()} ${path} is not in /openapi.json`);
  const schema = operation.responses[status]?.content?.["application/json"]?.schema;
  assert.ok(schema, `${method.toUpperCase()} ${path} has no ${status} JSON schema in /openapi.json`);
  assert.deepEqual(check(answer, schema), [], `${method.toUpperCase()} ${path}`);
  return answer;
}

const QUESTION = "Why do honeybee colonies collapse?";
const DECISION = {
  state: { root_query: QUESTION, frame_query: "", parent_goal: "", retained: [], depth: 0 },
  candidates: [
    { query: "varroa mite parasite load in hives", goal: "parasites" },
    { query: "neonicotinoid pesticide field studies on bees", goal: "pesticides" },
    { query: "honey prices by country 2023", goal: "market" },
  ],
};
const HITS = [
  { id: "https://bees.example/varroa", title: "Varroa mites", snippet: "Mites spread viruses that weaken colonies.", rank: 0 },
  { id: "https://shop.example/tools", title: "Beekeeping supplies sale", snippet: "Hive tools at half price.", rank: 1 },
];

test("health and models", async () => {
  const health = conforms(await client.health(), "/health", "get");
  assert.equal(health.status, "ok");
  assert.deepEqual([...health.stages].sort(), ["pre", "read"]);
  const models = conforms(await client.models(), "/v1/models", "get");
  assert.equal(models.models.length, 2);
});

test("select: which sub-queries to search", async () => {
  const sel = conforms(await client.select(DECISION), "/v1/select", "post");
  assert.equal(sel.p_keep.length, 3);
  assert.ok(sel.kept.length >= 1 && sel.kept.every((i) => i >= 0 && i < 3)); // a pre-retrieval gate keeps its top-1
  const all = await client.select({ ...DECISION, tau: 0 });
  assert.deepEqual(all.kept, [0, 1, 2]);
});

test("read: which hits to read, and a hit read before is not new", async () => {
  const state = { root_query: QUESTION, query: "varroa mites", read_ids: ["https://bees.example/varroa"] };
  const sel = conforms(await client.read({ state, hits: HITS, tau: 0 }), "/v1/read", "post");
  assert.equal(sel.stage, "read");
  assert.deepEqual(sel.kept, [1]);
  assert.deepEqual(sel.not_new, [0]);
  assert.equal(sel.p_keep[0], null);
});

test("a budgeted run: open, select, status, spend, close", async () => {
  const opened = conforms(await client.openRun({ budget_nodes: 1, defer: true }), "/v1/runs", "post", "201");
  const runId = opened.run_id;
  assert.deepEqual(opened.limit, { nodes: 1, tokens: null });
  const first = conforms(await client.runSelect(runId, { ...DECISION, tau: 0 }), "/v1/runs/{run_id}/select", "post");
  assert.equal(first.kept.length, 1); // the budget admits one node (the top-1 when none beats the price)
  const second = await client.runSelect(runId, { ...DECISION, tau: 0 });
  assert.deepEqual(second.kept, []);
  assert.equal(second.exhausted, true);
  const status = conforms(await client.run(runId), "/v1/runs/{run_id}", "get");
  assert.equal(status.spent_nodes, 1);
  conforms(await client.spend(runId, { spend: [200] }), "/v1/runs/{run_id}/spend", "post");
  const revisit = await client.revisit(runId, { state: DECISION.state });
  conforms(revisit, "/v1/runs/{run_id}/revisit", "post");
  const closed = conforms(await client.closeRun(runId), "/v1/runs/{run_id}/close", "post");
  assert.equal(closed.spent_tokens, 200);
  await assert.rejects(client.run(runId), (e) => e instanceof BranchgateError && e.status === 404);
});

test("refusals are BranchgateErrors naming the field, as /openapi.json describes them", async () => {
  await assert.rejects(client.openRun({ budget_nodes: -1 }), (e) => {
    assert.ok(e instanceof BranchgateError);
    assert.equal(e.status, 422);
    assert.equal(e.field, "budget_nodes");
    return true;
  });
  const raw = await fetch(`${baseUrl}/v1/runs/nope`);
  conforms(await raw.json(), "/v1/runs/{run_id}", "get", "404");
});

test("the URL-list example gates node-DeepResearch-style results", async () => {
  const example = fileURLToPath(new URL("../examples/gate-urls.mjs", import.meta.url));
  const { stdout } = await promisify(execFile)(process.execPath, [example], { env: { ...process.env } });
  const lines = stdout.trim().split("\n");
  assert.equal(lines.filter((l) => /^(read|skip): https:\/\//.test(l)).length, 3);
  assert.ok(lines.some((l) => l.startsWith("read: "))); // floor "root": at least the best one is read
  const items = [{ url: "https://a.example/1", title: "Varroa mites", description: "Mites weaken colonies." }];
  const choice = await gateUrls(client, items, { question: QUESTION, query: "varroa", readUrls: [items[0].url] });
  assert.deepEqual(choice.read, []);
  assert.deepEqual(choice.skipped, items);
});
