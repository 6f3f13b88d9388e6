// A typed client for `branchgate serve` (Node >= 18, or any runtime with fetch). Every request and answer type
// is derived from the server's /openapi.json (src/openapi.ts, written by `npm run gen` with openapi-typescript),
// so a change in the server's schema is a type error here (test/client.test.mjs checks both).
import type { components, paths } from "./openapi.js";

export type { components, paths };
export type Schemas = components["schemas"];

type Json<T> = T extends { content: { "application/json": infer B } } ? B : never;
/** The JSON answer of a path's operation (its 200 or 201 response). */
export type Answer<P extends keyof paths, M extends "get" | "post"> = paths[P][M] extends {
  responses: infer R;
}
  ? R extends { 200: infer OK }
    ? Json<OK>
    : R extends { 201: infer Created }
      ? Json<Created>
      : never
  : never;
/** A request body as the client takes it: the schema's fields, those that may be null also left out. */
export type Body<P extends keyof paths> = paths[P]["post"] extends { requestBody?: infer B }
  ? Optional<Json<NonNullable<B>>>
  : never;
type Optional<T> = { [K in keyof T as null extends T[K] ? never : K]: T[K] } & {
  [K in keyof T as null extends T[K] ? K : never]?: T[K];
};

export type Health = Answer<"/health", "get">;
export type Models = Answer<"/v1/models", "get">;
export type Selection = Answer<"/v1/select", "post">;
export type ReadSelection = Answer<"/v1/read", "post">;
export type RunStatus = Answer<"/v1/runs/{run_id}", "get">;
export type RunSelection = Answer<"/v1/runs/{run_id}/select", "post">;
export type ClosedRun = Answer<"/v1/runs/{run_id}/close", "post">;
export type SelectRequest = Body<"/v1/select">;
export type ReadRequest = Body<"/v1/read">;
export type OpenRunRequest = Body<"/v1/runs">;
export type RunSelectRequest = Body<"/v1/runs/{run_id}/select">;
export type RevisitRequest = Body<"/v1/runs/{run_id}/revisit">;
export type SpendRequest = Body<"/v1/runs/{run_id}/spend">;
export type CloseRequest = Body<"/v1/runs/{run_id}/close">;

/** A refusal from the server: its HTTP status and `{"error": {"field", "message"}}`. */
export class BranchgateError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly field: string | null = null,
  ) {
    super(`${status}${field ? ` ${field}` : ""}: ${message}`);
    this.name = "BranchgateError";
  }
}

export interface ClientOptions {
  /** The server's base URL (default http://127.0.0.1:8000). */
  baseUrl?: string;
  /** An API key, sent as the `x-api-key` header (servers started with keys need one). */
  apiKey?: string;
  /** Milliseconds before a request is abandoned (default 30000). */
  timeoutMs?: number;
  /** A fetch implementation (default: the global one). */
  fetch?: typeof fetch;
}

export class BranchgateClient {
  readonly baseUrl: string;
  private readonly apiKey?: string;
  private readonly timeoutMs: number;
  private readonly fetchImpl: typeof fetch;

  constructor(options: ClientOptions = {}) {
    this.baseUrl = (options.baseUrl ?? "http://127.0.0.1:8000").replace(/\/+$/, "");
    this.apiKey = options.apiKey;
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.fetchImpl = options.fetch ?? globalThis.fetch;
  }

  /** GET /health: the server is up; its stages and open runs. */
  health(): Promise<Health> {
    return this.call("GET", "/health");
  }

  /** GET /v1/models: the controllers it serves. */
  models(): Promise<Models> {
    return this.call("GET", "/v1/models");
  }

  /** POST /v1/select: which candidate sub-queries to search (a pre-retrieval controller). */
  select(body: SelectRequest): Promise<Selection> {
    return this.call("POST", "/v1/select", body);
  }

  /** POST /v1/read: which hits of a search to read (a read controller). */
  read(body: ReadRequest): Promise<ReadSelection> {
    return this.call("POST", "/v1/read", body);
  }

  /** POST /v1/runs: open a budgeted run. */
  openRun(body: OpenRunRequest = {} as OpenRunRequest): Promise<RunStatus> {
    return this.call("POST", "/v1/runs", body);
  }

  /** GET /v1/runs/{run_id}: a run's budget now. */
  run(runId: string): Promise<RunStatus> {
    return this.call("GET", `/v1/runs/${encodeURIComponent(runId)}`);
  }

  /** POST /v1/runs/{run_id}/select: one decision within the run's budget. */
  runSelect(runId: string, body: RunSelectRequest): Promise<RunSelection> {
    return this.call("POST", `/v1/runs/${encodeURIComponent(runId)}/select`, body);
  }

  /** POST /v1/runs/{run_id}/revisit: which deferred candidates to expand now. */
  revisit(runId: string, body: RevisitRequest): Promise<RunSelection> {
    return this.call("POST", `/v1/runs/${encodeURIComponent(runId)}/revisit`, body);
  }

  /** POST /v1/runs/{run_id}/spend: the tokens expansions really used. */
  spend(runId: string, body: SpendRequest): Promise<RunStatus> {
    return this.call("POST", `/v1/runs/${encodeURIComponent(runId)}/spend`, body);
  }

  /** POST /v1/runs/{run_id}/close: close the run (its deferred candidates never expanded). */
  closeRun(runId: string, body: CloseRequest = {} as CloseRequest): Promise<ClosedRun> {
    return this.call("POST", `/v1/runs/${encodeURIComponent(runId)}/close`, body);
  }

  private async call<T>(method: "GET" | "POST", path: string, body?: unknown): Promise<T> {
    const headers: Record<string, string> = { accept: "application/json" };
    if (body !== undefined) headers["content-type"] = "application/json";
    if (this.apiKey) headers["x-api-key"] = this.apiKey;
    const response = await this.fetchImpl(this.baseUrl + path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(this.timeoutMs),
    });
    const text = await response.text();
    let answer: unknown;
    try {
      answer = JSON.parse(text);
    } catch {
      throw new BranchgateError(response.status, `not JSON: ${text.slice(0, 200)}`);
    }
    if (!response.ok) {
      const error = (answer as { error?: { field?: string | null; message?: string } }).error ?? {};
      throw new BranchgateError(response.status, error.message ?? text.slice(0, 200), error.field ?? null);
    }
    return answer as T;
  }
}

/** A search result as node-DeepResearch lists URLs before reading them. */
export interface UrlItem {
  url: string;
  title?: string;
  description?: string;
}

export interface UrlChoice<T extends UrlItem> {
  read: T[];
  skipped: T[];
  selection: ReadSelection;
}

/**
 * Gate a search's URL list: which of the items to read (fetch), given the run's question, the query searched and
 * what has been read. Each item is a hit {id: url, title, snippet: description, rank: its position}; `read` keeps
 * the list's order.
 */
export async function gateUrls<T extends UrlItem>(
  client: BranchgateClient,
  items: T[],
  state: { question: string; query: string; goal?: string; read?: string[]; readUrls?: string[]; depth?: number },
  options: { tau?: number; floor?: "root" } = {},
): Promise<UrlChoice<T>> {
  const hits = items.map((item, rank) => ({
    id: item.url,
    url: item.url,
    title: item.title ?? "",
    snippet: item.description ?? "",
    rank,
  }));
  const selection = await client.read({
    state: {
      root_query: state.question,
      query: state.query,
      goal: state.goal ?? "",
      read: state.read ?? [],
      read_ids: state.readUrls ?? [],
      depth: state.depth ?? 0,
    },
    hits,
    ...options,
  });
  const kept = new Set(selection.kept);
  return {
    read: items.filter((_, i) => kept.has(i)),
    skipped: items.filter((_, i) => !kept.has(i)),
    selection,
  };
}
