// Gate a node-DeepResearch-style URL list ({url, title, description} per search result) before reading any page.
// Start the server first:  branchgate serve --read pretrained:read
// Then:                    npm run build && BRANCHGATE_URL=http://127.0.0.1:8000 node examples/gate-urls.mjs
import { BranchgateClient, gateUrls } from "../dist/index.js";

const client = new BranchgateClient({ baseUrl: process.env.BRANCHGATE_URL });
const results = [
  { url: "https://bees.example/varroa", title: "Varroa mites and colony losses", description: "Mites spread deformed wing virus; infested colonies collapse by spring." },
  { url: "https://shop.example/hive-tools", title: "Beekeeping supplies sale", description: "Hive tools and suits at half price this week." },
  { url: "https://bees.example/neonicotinoids", title: "Pesticides and foraging", description: "Neonicotinoids impair honeybee navigation at field doses." },
];
const { read, skipped, selection } = await gateUrls(client, results, {
  question: "Why do honeybee colonies collapse?",
  query: "honeybee colony collapse causes",
}, { floor: "root" }); // "root": at the root question, the best result is read even when none passes τ
for (const item of read) console.log(`read: ${item.url}`);
for (const item of skipped) console.log(`skip: ${item.url}`);
console.log(`p_keep: ${selection.p_keep.map((p) => (p === null ? "-" : p.toFixed(3))).join(" ")}`);
