'use strict'
/*
 * What kafkajs_driver.js and kafkajs_transactions.js share: how a command is run (one JSON
 * spec on stdin, one JSON object per line on stdout, kafkajs's own log on stderr), the
 * client they build, and how an error is printed. kafkajs is found on NODE_PATH, as the
 * tests set it; this file by its path, beside them.
 */

const { Kafka, logLevel } = require('kafkajs')

// Buffers cross as base64 strings and bigints as decimal strings: JSON has neither.
const print = object => process.stdout.write(JSON.stringify(object, bytesAsBase64) + '\n')

function bytesAsBase64 (_key, value) {
  if (value && value.type === 'Buffer' && Array.isArray(value.data)) {
    return Buffer.from(value.data).toString('base64')
  }
  if (typeof value === 'bigint') return value.toString()
  return value
}

function stderrLogger () {
  return ({ namespace, label, log }) => {
    const { message, ...extra } = log
    process.stderr.write(`${label} [${namespace}] ${message} ${JSON.stringify(extra)}\n`)
  }
}

function client (spec, clientId) {
  return new Kafka({
    clientId,
    brokers: spec.brokers,
    logLevel: logLevel.WARN,
    logCreator: stderrLogger,
    // Bounded, so an answer that never comes fails within the test's timeout.
    requestTimeout: 15000,
    retry: { retries: 5, initialRetryTime: 100, maxRetryTime: 2000, ...(spec.retry || {}) }
  })
}

function describeError (e) {
  if (!(e instanceof Error)) return { message: String(e) }
  const out = { name: e.name, message: e.message }
  for (const key of ['type', 'code', 'retriable', 'topic', 'groupId']) {
    if (e[key] !== undefined) out[key] = e[key]
  }
  if (Array.isArray(e.errors)) out.errors = e.errors.map(describeError)
  if (Array.isArray(e.partitions)) {
    out.partitions = e.partitions.map(p => ({ ...p, error: p.error && describeError(p.error) }))
  }
  if (Array.isArray(e.groups)) {
    out.groups = e.groups.map(g => ({ ...g, error: g.error && describeError(g.error) }))
  }
  if (e.cause) out.cause = describeError(e.cause)
  return out
}

// Runs `commands[process.argv[2]]` on the spec read from stdin. Exit code 1 when the command
// returned true (it failed) or threw (printed first as an `error` line), 0 otherwise.
function runCommand (commands) {
  const main = async () => {
    const command = process.argv[2]
    const chunks = []
    for await (const chunk of process.stdin) chunks.push(chunk)
    const spec = JSON.parse(Buffer.concat(chunks).toString('utf8') || '{}')
    if (!Object.hasOwn(commands, command)) throw new Error(`unknown command ${command}`)
    const failed = await commands[command](spec)
    process.exitCode = failed ? 1 : 0
  }
  main().catch(e => {
    print({ event: 'error', error: describeError(e) })
    process.exitCode = 1
  })
}

module.exports = { print, client, describeError, runCommand }
