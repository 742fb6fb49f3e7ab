'use strict'
/*
 * kafkajs driven by tests/compat/test_kafkajs.py: `node kafkajs_driver.js COMMAND` reads one
 * JSON object on stdin and prints one JSON object per line on stdout; kafkajs's own log goes
 * to stderr. Exit code 0 when the command did what it was asked, 1 when kafkajs threw (the
 * error is printed as an `error` line first) or an admin operation failed.
 *
 * Bytes cross as base64 strings (null stays null), so keys, values and headers can be any
 * bytes. Headers are a list of [name, value] pairs; kafkajs keeps them as an object whose
 * repeated names hold arrays, so pairs sharing a name must be adjacent to keep their order.
 *
 * produce  {brokers, topic, records: [{key, value, headers, timestamp}], partition?, acks,
 *           compression, idempotent, chunk}
 *          One `send` per `chunk` records, each awaited before the next: kafkajs answers a
 *          send with one base offset per partition, and a record's offset is that plus its
 *          place among the send's records for the partition. Prints
 *          {event: "ack", index, partition, offset} per record, the partition being the one
 *          kafkajs's partitioner chose (offset null for acks=0: kafkajs is told nothing).
 * consume  {brokers, topic, groupId, count, members?, seek?: {partition: offset},
 *           autoCommit, fromBeginning, idleMs, timeoutMs}
 *          `members` consumers (default 1) in one group; `seek` moves each named partition
 *          to an offset once the consumers run (kafkajs has no assign(): this is how it
 *          reads a partition from an offset). Prints every record, assignment and commit
 *          as events, then {event: "end", reason}; stops once `count` records arrived,
 *          after `idleMs` without one, or at `timeoutMs`.
 * admin    {brokers, ops: [{op, args}]}
 *          Each op is a method of kafkajs's admin client called with `args` (a list of
 *          arguments), in order, on one connected admin; prints {op, ms, result} or
 *          {op, ms, error}. Config resource types are given by name (TOPIC, BROKER).
 */

const { CompressionTypes, CompressionCodecs, ConfigResourceTypes, Partitioners } =
  require('kafkajs')
const LZ4Codec = require('kafkajs-lz4')
const SnappyCodec = require('kafkajs-snappy')
const zstd = require('zstd-napi')
const { print, client, describeError, runCommand } = require('./kafkajs_common')

CompressionCodecs[CompressionTypes.Snappy] = SnappyCodec
CompressionCodecs[CompressionTypes.LZ4] = new LZ4Codec().codec
// As @sensejs/kafkajs-zstd-support does (its CommonJS build does not load).
CompressionCodecs[CompressionTypes.ZSTD] = () => ({
  compress: async encoder => zstd.compress(encoder.buffer),
  decompress: async buffer => zstd.decompress(buffer)
})

const CODECS = {
  none: CompressionTypes.None,
  gzip: CompressionTypes.GZIP,
  snappy: CompressionTypes.Snappy,
  lz4: CompressionTypes.LZ4,
  zstd: CompressionTypes.ZSTD
}

const toBytes = text => (text === null || text === undefined ? null : Buffer.from(text, 'base64'))
const fromBytes = data => (data === null || data === undefined ? null : data.toString('base64'))

function toHeaders (pairs) {
  const headers = {}
  for (const [name, value] of pairs || []) {
    const bytes = toBytes(value)
    if (!(name in headers)) headers[name] = bytes
    else if (Array.isArray(headers[name])) headers[name].push(bytes)
    else headers[name] = [headers[name], bytes]
  }
  return headers
}

function fromHeaders (headers) {
  const pairs = []
  for (const [name, value] of Object.entries(headers || {})) {
    for (const one of Array.isArray(value) ? value : [value]) pairs.push([name, fromBytes(one)])
  }
  return pairs
}

async function produce (spec) {
  // kafkajs's own partitioner, watched: it is called on each message object a send places,
  // so the last call for a message is the partition it went to.
  const placed = new WeakMap()
  const watchedPartitioner = () => {
    const partitioner = Partitioners.DefaultPartitioner()
    return args => {
      const partition = partitioner(args)
      placed.set(args.message, partition)
      return partition
    }
  }
  const producer = client(spec, 'kiln-compat-kafkajs-producer').producer({
    idempotent: Boolean(spec.idempotent),
    // kafkajs refuses an idempotent producer with more than one request in flight.
    maxInFlightRequests: spec.idempotent ? 1 : undefined,
    createPartitioner: watchedPartitioner
  })
  await producer.connect()
  try {
    const chunk = spec.chunk || spec.records.length
    for (let start = 0; start < spec.records.length; start += chunk) {
      const messages = spec.records.slice(start, start + chunk).map(r => ({
        key: toBytes(r.key),
        value: toBytes(r.value),
        headers: toHeaders(r.headers),
        timestamp: r.timestamp === undefined ? undefined : String(r.timestamp),
        partition: spec.partition ?? undefined
      }))
      const answers = await producer.send({
        topic: spec.topic,
        messages,
        acks: spec.acks,
        compression: CODECS[spec.compression || 'none'],
        timeout: 15000
      })
      // The answer names each partition once, with the offset of the send's first record
      // there; the others follow it in send order. acks=0 is answered with nothing.
      const base = new Map(answers.map(a => [a.partition, BigInt(a.baseOffset)]))
      const next = new Map()
      messages.forEach((message, i) => {
        const partition = placed.get(message)
        const seen = next.get(partition) || 0n
        next.set(partition, seen + 1n)
        const offset = spec.acks === 0 ? null : Number(base.get(partition) + seen)
        print({ event: 'ack', index: start + i, partition, offset })
      })
    }
  } finally {
    await producer.disconnect()
  }
}

async function consume (spec) {
  const kafka = client(spec, 'kiln-compat-kafkajs-consumer')
  const members = spec.members || 1
  const consumers = []
  let read = 0
  let lastRecordAt = Date.now()
  let finish
  const finished = new Promise(resolve => { finish = resolve })

  for (let member = 0; member < members; member++) {
    const consumer = kafka.consumer({
      groupId: spec.groupId,
      sessionTimeout: 10000,
      heartbeatInterval: 500,
      rebalanceTimeout: 10000,
      maxWaitTimeInMs: 200,
      allowAutoTopicCreation: false
    })
    consumers.push(consumer)
    const { GROUP_JOIN, COMMIT_OFFSETS } = consumer.events
    consumer.on(GROUP_JOIN, ({ payload }) => print({
      event: 'assigned',
      member,
      partitions: (payload.memberAssignment[spec.topic] || []).slice().sort((a, b) => a - b)
    }))
    consumer.on(COMMIT_OFFSETS, ({ payload }) => print({
      event: 'committed',
      member,
      offsets: payload.topics.flatMap(t => t.partitions.map(p => ({
        topic: t.topic, partition: Number(p.partition), offset: Number(p.offset)
      })))
    }))
    await consumer.connect()
    await consumer.subscribe({ topics: [spec.topic], fromBeginning: spec.fromBeginning !== false })
    await consumer.run({
      autoCommit: spec.autoCommit !== false,
      eachMessage: async ({ topic, partition, message }) => {
        if (read >= spec.count) return
        read += 1
        lastRecordAt = Date.now()
        print({
          event: 'record',
          member,
          topic,
          partition,
          offset: Number(message.offset),
          key: fromBytes(message.key),
          value: fromBytes(message.value),
          headers: fromHeaders(message.headers),
          timestamp: Number(message.timestamp)
        })
        if (read >= spec.count) finish('count')
      }
    })
    for (const [partition, offset] of Object.entries(spec.seek || {})) {
      consumer.seek({ topic: spec.topic, partition: Number(partition), offset: String(offset) })
    }
  }

  const started = Date.now()
  const ticker = setInterval(() => {
    if (Date.now() - started > (spec.timeoutMs || 30000)) finish('timeout')
    else if (spec.idleMs && read > 0 && Date.now() - lastRecordAt > spec.idleMs) finish('idle')
  }, 50)
  const reason = await finished
  clearInterval(ticker)
  // Disconnecting waits for the batch being processed, commits it (autoCommit) and leaves
  // the group.
  await Promise.all(consumers.map(c => c.disconnect()))
  print({ event: 'end', reason, read })
}

async function admin (spec) {
  const adminClient = client(spec, 'kiln-compat-kafkajs-admin').admin()
  await adminClient.connect()
  let failed = false
  try {
    for (const { op, args } of spec.ops) {
      const resolved = (args || []).map(arg => withResourceTypes(arg))
      const started = Date.now()
      try {
        const result = await adminClient[op](...resolved)
        print({ op, ms: Date.now() - started, result: result === undefined ? null : result })
      } catch (e) {
        failed = true
        print({ op, ms: Date.now() - started, error: describeError(e) })
      }
    }
  } finally {
    await adminClient.disconnect()
  }
  return failed
}

function withResourceTypes (arg) {
  if (!arg || !Array.isArray(arg.resources)) return arg
  return {
    ...arg,
    resources: arg.resources.map(r => ({ ...r, type: ConfigResourceTypes[r.type] ?? r.type }))
  }
}

runCommand({ produce, consume, admin })
