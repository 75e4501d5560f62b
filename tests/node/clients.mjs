// The official Node clients, unchanged but for their base URL, against the gateway: OpenAI's
// SDK (Chat Completions and the Responses API, plain and streamed with its own stream helpers)
// and the Vercel AI SDK (generateText and streamText through its OpenAI and Anthropic
// providers). Models on translated pools: `claude-*` (Anthropic's API) and `gpt-*` (Chat
// Completions only). Usage: node clients.mjs <base url ending in /v1> <key>; prints one JSON
// object naming each case's outcome, which tests/sdk/test_node_clients.py checks.

import OpenAI from "openai";
import { generateText, streamText, tool, jsonSchema } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { createAnthropic } from "@ai-sdk/anthropic";

const [baseURL, apiKey] = process.argv.slice(2);
const CLAUDE = "claude-sonnet-5-5";
const GPT = "gpt-5.1";
const weather = {
  type: "object",
  properties: { city: { type: "string" } },
  required: ["city"],
};
const tools = { get_weather: tool({ description: "The weather in a city.", inputSchema: jsonSchema(weather) }) };

const openai = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const aiOpenAI = createOpenAI({ baseURL, apiKey });
const aiAnthropic = createAnthropic({ baseURL, apiKey });

const cases = {
  async openai_chat_plain() {
    const c = await openai.chat.completions.create({
      model: CLAUDE,
      messages: [{ role: "user", content: "say hello to me" }],
    });
    return { text: c.choices[0].message.content, finish: c.choices[0].finish_reason, usage: c.usage };
  },
  async openai_chat_stream_tools() {
    const s = openai.chat.completions.stream({
      model: CLAUDE,
      messages: [{ role: "user", content: "weather?" }],
      tools: [{ type: "function", function: { name: "get_weather", parameters: weather } }],
      stream_options: { include_usage: true },
    });
    const c = await s.finalChatCompletion();
    const call = c.choices[0].message.tool_calls[0];
    return { finish: c.choices[0].finish_reason, name: call.function.name, args: JSON.parse(call.function.arguments) };
  },
  async openai_responses_stream() {
    const s = openai.responses.stream({ model: CLAUDE, input: "say hello to me", store: false });
    const r = await s.finalResponse();
    return { text: r.output_text, status: r.status, usage: r.usage };
  },
  async ai_openai_chat_generate() {
    const r = await generateText({ model: aiOpenAI.chat(CLAUDE), prompt: "say hello to me" });
    return { text: r.text, finish: r.finishReason, usage: r.usage };
  },
  async ai_openai_chat_stream_tools() {
    const r = streamText({ model: aiOpenAI.chat(CLAUDE), prompt: "weather?", tools });
    const calls = await r.toolCalls;
    return { finish: await r.finishReason, calls: calls.map((c) => [c.toolName, c.input]) };
  },
  async ai_openai_responses_stream() {
    const r = streamText({ model: aiOpenAI.responses(CLAUDE), prompt: "say hello to me", providerOptions: { openai: { store: false } } });
    return { text: await r.text, finish: await r.finishReason };
  },
  async ai_anthropic_generate() {
    const r = await generateText({ model: aiAnthropic(GPT), prompt: "say hello to me", maxOutputTokens: 100 });
    return { text: r.text, finish: r.finishReason, usage: r.usage };
  },
  async ai_anthropic_stream_tools() {
    const r = streamText({ model: aiAnthropic(GPT), prompt: "weather?", tools, maxOutputTokens: 100 });
    const calls = await r.toolCalls;
    return { finish: await r.finishReason, calls: calls.map((c) => [c.toolName, c.input]) };
  },
};

const out = {};
for (const [name, run] of Object.entries(cases)) {
  try {
    out[name] = { ok: true, ...(await run()) };
  } catch (e) {
    out[name] = { ok: false, error: String(e && e.stack ? e.stack : e).slice(0, 800) };
  }
}
process.stdout.write(JSON.stringify(out) + "\n");
