// ctxd's OpenCode plugin: every OpenCode session is a ctxd session (README.md, "OpenCode").
//
// - tool.execute.after: every tool output is appended to the ctxd session as a `tool`
//   message; ctxd offloads a large one (docs/protocol.md, "Offloaded tool results") and
//   the model sees ctxd's stub instead, with the ref_id to read the rest with result.read.
//   When OpenCode cut the output itself (over 2,000 lines or 50 KB: `...output
//   truncated...`, `Full output saved to: PATH`), ctxd gets the whole output from the file
//   OpenCode saved, read only inside OpenCode's own tool-output folder and up to
//   FULL_OUTPUT_BYTES, so that reading it back returns what the command printed. The
//   answers of ctxd's own tools are recorded but never replaced by a stub.
// - experimental.chat.system.transform: the memories that match the user's last prompt
//   and the session's pending injections (inject.pull, then inject.ack) join the system
//   prompt.
// - tool.execute.before: a call of ctxd's MCP tools (`ctxd_…`) names the OpenCode
//   conversation's session and project in its arguments' `_meta`: OpenCode runs one MCP
//   server for all its sessions, and this is how read_result, context_branch, memory_record
//   and the others act on the session the plugin records (docs/decisions.md, "Agents end to
//   end"; docs/protocol.md, "MCP"). OpenCode stores the call's arguments with it:
//   experimental.chat.messages.transform takes it out of what the model is sent.
// - experimental.session.compacting: ctxd compacts its copy of the session first, which
//   saves its snapshot (docs/protocol.md, "Snapshots and session.resume").
// - event: user and assistant text is recorded (message.append) and each finished
//   assistant message's token usage (usage.record, keyed by the message id).
//
// When OpenCode's Anthropic provider has its baseURL at this ctxd's model gateway
// (`ctxctl install opencode` at user scope sets it), the gateway records the conversation,
// offloads its results, delivers memories and injections and records the usage, from what
// the model is sent: the plugin then only opens the session (with its project), names it
// to the gateway (chat.headers: the `x-ctxd-session` header, so that the gateway's session
// is OpenCode's own) and compacts ctxd's copy; it records nothing itself, which would
// record the conversation twice (docs/decisions.md, Gateway).
//
// It talks to the daemon over its Unix socket (newline-delimited JSON-RPC 2.0). Every call
// is bounded by a short timeout and fails open: no daemon, a timeout or an error, and
// the plugin changes nothing (docs/decisions.md, "OpenCode plugin"). It talks only to a
// socket that is the user's own ctxd's (`trusted`).
// No dependencies beyond node's built-ins.

import fs from "node:fs"
import net from "node:net"
import os from "node:os"
import path from "node:path"

const TIMEOUT_MS = Number(process.env.CTXD_PLUGIN_TIMEOUT_MS) || 2000
const OFFLOAD_BYTES = 4096 // ctxd's default offload_threshold_bytes: smaller stays as is
const MEMORY_CHARS = 4000 // about 1,000 tokens of memories a prompt
const MEMORIES = 5
const GATEWAY_PROVIDER = "anthropic" // the provider `ctxctl install opencode` points at the gateway
const UNNAMED_AGENTS = new Set(["title", "summary"]) // side requests: a conversation of their own
const MCP_TOOLS = "ctxd_" // OpenCode names an MCP tool `<server>_<tool>`; install names the server ctxd
const FULL_OUTPUT_BYTES = 4 * 1024 * 1024 // a saved output larger than this is left as OpenCode cut it

function socketPath(env = process.env) {
  if (env.CTXD_SOCKET) return env.CTXD_SOCKET
  if (env.XDG_RUNTIME_DIR) return path.join(env.XDG_RUNTIME_DIR, "ctxd", "ctxd.sock")
  return path.join("/tmp", `ctxd-${os.userInfo().uid}`, "ctxd.sock")
}

// Whether the socket at `where` may be the user's own ctxd's (docs/security.md, "Who
// serves the socket"): its directory is the user's own with mode 0700, so only they (and
// root) could have put a socket there, and the socket is the user's. Node cannot read
// SO_PEERCRED, so who listens is not asked of the connection itself.
function trusted(where) {
  const uid = process.getuid()
  try {
    const directory = fs.statSync(path.dirname(where))
    const socket = fs.statSync(where)
    return directory.uid === uid && (directory.mode & 0o077) === 0 && socket.isSocket() &&
      socket.uid === uid
  } catch {
    return false // nothing there: no daemon
  }
}

// One JSON-RPC call on a connection of its own; resolves to the result, or undefined on
// any failure (fail open), a socket that is not `trusted` among them (never connected).
function call(method, params, timeoutMs = TIMEOUT_MS) {
  const where = socketPath()
  if (!trusted(where)) return Promise.resolve(undefined)
  return new Promise((resolve) => {
    let done = false
    let buffer = ""
    const socket = net.createConnection(where)
    const finish = (value) => {
      if (done) return
      done = true
      clearTimeout(timer)
      socket.destroy()
      resolve(value)
    }
    const timer = setTimeout(() => finish(undefined), timeoutMs)
    socket.setEncoding("utf8")
    socket.on("error", () => finish(undefined))
    socket.on("close", () => finish(undefined))
    socket.on("connect", () => {
      socket.write(JSON.stringify({ jsonrpc: "2.0", id: 1, method, params }) + "\n")
    })
    socket.on("data", (chunk) => {
      buffer += chunk
      const end = buffer.indexOf("\n")
      if (end < 0) return
      try {
        const answer = JSON.parse(buffer.slice(0, end))
        finish(answer.error ? undefined : answer.result)
      } catch {
        finish(undefined)
      }
    })
  })
}

// OpenCode's folder for the whole outputs it cut: `$XDG_DATA_HOME/opencode/tool-output`.
function toolOutputFolder(env = process.env) {
  const data = env.XDG_DATA_HOME || path.join(os.homedir(), ".local", "share")
  return path.join(data, "opencode", "tool-output")
}

// The whole output OpenCode saved at `where` when it cut a tool's output; undefined unless
// `where` is a regular file inside OpenCode's tool-output folder (links resolved first:
// never a file elsewhere, whatever the output says) of at most FULL_OUTPUT_BYTES.
function savedOutput(where) {
  if (typeof where !== "string" || !path.isAbsolute(where)) return undefined
  try {
    const folder = fs.realpathSync(toolOutputFolder())
    const file = fs.realpathSync(where)
    if (path.dirname(file) !== folder) return undefined
    const stat = fs.statSync(file)
    if (!stat.isFile() || stat.size > FULL_OUTPUT_BYTES) return undefined
    return fs.readFileSync(file, "utf8")
  } catch {
    return undefined // gone (OpenCode deletes them after 7 days), unreadable
  }
}

function textOf(output) {
  if (typeof output === "string") return output
  if (Array.isArray(output))
    return output.filter((part) => part?.type === "text").map((part) => part.text).join("\n")
  return ""
}

function trimmed(url) {
  return typeof url === "string" ? url.replace(/\/+$/, "") : undefined
}

export const CtxdPlugin = async ({ directory, client } = {}) => {
  const opened = new Map() // sessionID → Promise<boolean>
  const roles = new Map() // messageID → role
  const recorded = new Set() // part ids and message ids already sent
  const prompts = new Map() // sessionID → the user's last prompt
  // Appends go to ctxd one after another, in the order the plugin saw them: OpenCode runs
  // event handlers without waiting for the previous one, and two appends racing on two
  // connections could land in the other order (a summary after the message that follows it).
  let appends = Promise.resolve()
  const inOrder = (fn) => {
    const next = appends.then(fn)
    appends = next.catch(() => undefined)
    return next
  }

  // Whether the Anthropic provider's baseURL is this ctxd's gateway (its base URL and
  // /v1, as install writes it): the daemon is asked once it answers; false when it cannot
  // say (the plugin then does all it does without a gateway).
  let gatewayBase
  const isGateway = (baseURL) => {
    if (gatewayBase === undefined)
      gatewayBase = call("daemon.status", {}).then((status) => {
        if (status === undefined) gatewayBase = undefined // no daemon yet: ask again next time
        return typeof status?.gateway?.base_url === "string"
          ? `${trimmed(status.gateway.base_url)}/v1` : null
      })
    return gatewayBase.then((base) => base !== null && trimmed(baseURL) === base)
  }
  let configured // OpenCode's merged configuration (undefined when it cannot be read)
  const configuration = () => {
    if (configured === undefined)
      configured = Promise.resolve(client?.config?.get?.())
        .then((answer) => answer?.data ?? answer)
        .catch(() => undefined)
    return configured
  }
  const gatewayed = new Map() // sessionID → Promise<boolean>: its model calls go through the gateway
  // Whether a session's model calls go through the gateway: its provider (else the
  // configured model's) is the Anthropic one, whose baseURL (else the configured one) is the
  // gateway's.
  const decide = (sessionID, providerID, baseURL) => {
    const through = (async () => {
      const config = providerID && baseURL !== undefined ? undefined : await configuration()
      const provider = providerID ?? (typeof config?.model === "string" ? config.model.split("/")[0] : undefined)
      if (provider !== GATEWAY_PROVIDER) return false
      const url = baseURL !== undefined ? baseURL : config?.provider?.[GATEWAY_PROVIDER]?.options?.baseURL
      return url ? isGateway(url) : false
    })().catch(() => false)
    gatewayed.set(sessionID, through)
    return through
  }
  const standsBack = (sessionID) => gatewayed.get(sessionID) ?? Promise.resolve(false)

  const open = (sessionID) => {
    if (!opened.has(sessionID)) {
      const opening = call("session.open", {
        session_id: sessionID,
        ...(directory ? { project: directory } : {}),
      }).then((result) => {
        if (result === undefined) opened.delete(sessionID) // try again next time
        return result !== undefined
      })
      opened.set(sessionID, opening)
    }
    return opened.get(sessionID)
  }

  // A tool's output joins the ctxd session as a `tool` message (a large one is offloaded
  // there: docs/protocol.md, "Offloaded tool results"); false when it could not.
  const recordResult = (sessionID, callID, tool, content, isError) =>
    inOrder(async () => {
      if (!(await open(sessionID))) return false
      const appended = await call("message.append", {
        session_id: sessionID,
        messages: [{
          role: "tool", content, name: tool, tool_call_id: callID,
          ...(isError ? { meta: { is_error: true } } : {}),
        }],
      })
      return appended !== undefined
    })

  // The stub ctxd renders for the tool message just appended; undefined when it stayed
  // inline.
  const stubOf = async (sessionID, callID) => {
    const rendered = await call("ctxd.render", { session_id: sessionID, branch_id: null })
    const message = rendered?.messages?.findLast(
      (m) => m.role === "tool" && m.tool_call_id === callID,
    )
    if (typeof message?.content !== "string" || !message.content.includes("ref_id=")) return undefined
    return message.content
  }

  const recordPart = async (part) => {
    const role = roles.get(part.messageID)
    if (part.type !== "text" || !part.text || recorded.has(part.id)) return
    if (role !== "user" && !(role === "assistant" && part.time?.end)) return
    recorded.add(part.id)
    if (await standsBack(part.sessionID)) return
    if (role === "user") prompts.set(part.sessionID, part.text)
    await inOrder(async () => {
      if (!(await open(part.sessionID))) return
      await call("message.append", {
        session_id: part.sessionID,
        messages: [{ role, content: part.text, meta: { opencode_message_id: part.messageID } }],
      })
    })
  }

  const recordUsage = async (info) => {
    if (info.role !== "assistant" || !info.time?.completed || !info.tokens) return
    if (recorded.has(info.id)) return
    recorded.add(info.id)
    if (await standsBack(info.sessionID)) return
    const tokens = info.tokens
    const counts = {
      input_tokens: tokens.input ?? 0,
      output_tokens: tokens.output ?? 0,
      thinking_tokens: tokens.reasoning ?? 0,
      cache_read_tokens: tokens.cache?.read ?? 0,
      cache_write_tokens: tokens.cache?.write ?? 0,
    }
    if (!Object.values(counts).some((n) => n > 0)) return
    if (!(await open(info.sessionID))) return
    await call("usage.record", {
      session_id: info.sessionID,
      model: `${info.providerID}/${info.modelID}`,
      request_id: info.id,
      idempotency_key: `opencode:${info.id}`,
      ...counts,
    })
  }

  return {
    event: async ({ event }) => {
      try {
        if (event?.type === "message.updated") {
          const info = event.properties?.info
          if (!info) return
          roles.set(info.id, info.role)
          await recordUsage(info)
        } else if (event?.type === "message.part.updated") {
          const part = event.properties?.part
          if (part) await recordPart(part)
        }
      } catch {
        // fail open
      }
    },

    "chat.message": async (input, output) => {
      try {
        // Before the prompt's parts are stored (and their events recorded): whether this
        // session's model calls go through the gateway.
        if (input?.sessionID) await decide(input.sessionID, input.model?.providerID)
        const text = textOf(output?.parts)
        if (text) prompts.set(input.sessionID, text)
      } catch {
        // fail open
      }
    },

    "chat.headers": async (input, output) => {
      try {
        // A title or summary request (its model may be another provider's) decides nothing.
        if (!input?.sessionID || !output?.headers || UNNAMED_AGENTS.has(input.agent)) return
        const through = await decide(input.sessionID, input.model?.providerID,
          trimmed(input.provider?.options?.baseURL) ?? null)
        if (!through) return
        await open(input.sessionID)
        output.headers["x-ctxd-session"] = input.sessionID
      } catch {
        // fail open
      }
    },

    "tool.execute.before": async (input, output) => {
      try {
        const args = output?.args
        if (!input?.sessionID || !input.tool?.startsWith(MCP_TOOLS)) return
        if (typeof args !== "object" || args === null || Array.isArray(args)) return
        args._meta = {
          ...(typeof args._meta === "object" && args._meta !== null ? args._meta : {}),
          "ctxd/session_id": input.sessionID,
          ...(directory ? { "ctxd/project": directory } : {}),
        }
      } catch {
        // fail open
      }
    },

    // The model is sent its ctxd calls' arguments as it wrote them, without the `_meta`
    // that tool.execute.before added (OpenCode stored the arguments with it).
    "experimental.chat.messages.transform": async (input, output) => {
      try {
        for (const message of output?.messages ?? [])
          for (const part of message?.parts ?? []) {
            const args = part?.type === "tool" && part.tool?.startsWith(MCP_TOOLS)
              ? part.state?.input : undefined
            if (typeof args?._meta !== "object" || args._meta === null) continue
            const { "ctxd/session_id": _session, "ctxd/project": _project, ...rest } = args._meta
            if (Object.keys(rest).length) args._meta = rest
            else delete args._meta
          }
      } catch {
        // fail open
      }
    },

    "tool.execute.after": async (input, output) => {
      try {
        if (await standsBack(input.sessionID)) return
        let text
        let replace // how the model is shown the stub instead; none: never offloaded
        if (typeof output?.output === "string") {
          // a built-in tool; one whose output OpenCode cut has the whole in a file
          text = (output.metadata?.truncated === true &&
            savedOutput(output.metadata.outputPath)) || output.output
          replace = (stub) => { output.output = stub }
        } else if (Array.isArray(output?.content)) {
          // an MCP tool: its content parts; only all-text results are recorded, and an
          // error is never offloaded
          if (!output.content.every((part) => part?.type === "text")) return
          text = textOf(output.content)
          // ctxd's own tools' answers are never replaced: a read_result answer is what the
          // model asked to see
          if (!output.isError && !input.tool?.startsWith(MCP_TOOLS))
            replace = (stub) => { output.content = [{ type: "text", text: stub }] }
        } else return
        const recorded = await recordResult(
          input.sessionID, input.callID, input.tool, text, output.isError === true)
        if (!recorded || !replace || Buffer.byteLength(text, "utf8") <= OFFLOAD_BYTES) return
        const stub = await stubOf(input.sessionID, input.callID)
        if (stub !== undefined) replace(stub)
      } catch {
        // fail open
      }
    },

    "experimental.chat.system.transform": async (input, output) => {
      try {
        if (!input?.sessionID || !Array.isArray(output?.system)) return
        if (await standsBack(input.sessionID)) return
        const sections = []
        const query = prompts.get(input.sessionID)
        const [found, pulled] = await Promise.all([
          query ? call("memory.search", { query: query.slice(0, 2000), k: MEMORIES }) : undefined,
          open(input.sessionID).then((ok) =>
            ok ? call("inject.pull", { session_id: input.sessionID }) : undefined,
          ),
        ])
        let left = MEMORY_CHARS
        const memories = []
        for (const memory of found?.results ?? []) {
          const line = `- ${memory.title}: ${memory.content}`
          if (line.length > left) break
          left -= line.length
          memories.push(line)
        }
        if (memories.length)
          sections.push(`Lessons remembered from earlier sessions (ctxd):\n${memories.join("\n")}`)
        const injections = pulled?.injections ?? []
        if (injections.length)
          sections.push(`Notes for this session (ctxd):\n${injections.map((i) => i.content).join("\n\n")}`)
        if (sections.length) output.system.push(sections.join("\n\n"))
        await Promise.all(
          injections.map((i) => call("inject.ack", { injection_id: i.injection_id, accepted: true })),
        )
      } catch {
        // fail open
      }
    },

    "experimental.session.compacting": async (input) => {
      try {
        if (input?.sessionID && (await open(input.sessionID)))
          await call("context.compact", { session_id: input.sessionID }, TIMEOUT_MS * 5)
      } catch {
        // fail open
      }
    },
  }
}
