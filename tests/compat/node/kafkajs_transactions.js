'use strict'
/*
 * kafkajs's transactions driven by tests/compat/test_kafkajs_transactions.py:
 * `node kafkajs_transactions.js COMMAND` reads one JSON object on stdin and prints one JSON
 * object per line on stdout; kafkajs's own log goes to stderr. Exit code 0 when the command
 * ran to its end, 1 when kafkajs threw where no error was expected (printed as an `error`
 * line first). What it shares with kafkajs_driver.js is in kafkajs_common.js.
 *
 * Keys and values are UTF-8 strings here (null stays null): the transaction tests compare
 * which records are seen, not how bytes survive.
 *
 * script     {brokers, topic, producers: {name: transactionalId}, steps: [{producer,
 *             action, messages?, groupId?, offsets?}]}
 *            Transactional producers (idempotent, one request in flight, acks=-1 as
 *            kafkajs forces for them) run the steps in order: `begin` (producer.transaction(),
 *            which sends InitProducerId the first time), `send` (messages: [{partition, key,
 *            value}] in one send of the open transaction), `sendOffsets` (offsets:
 *            {partition: offset} of `topic` for group `groupId`), `commit`, `abort`. Each
 *            step prints {event: "step", index, producer, action, ok} with `acks`
 *            ([{partition, offset}] per message, in order) for a send, or `error` and
 *            `errorType` (the Kafka error kafkajs names, found through its wrappers) when it
 *            threw; the script goes on after a failed step.
 * read       {brokers, topic, groupId, readUncommitted, count, graceMs, timeoutMs}
 *            One consumer of a new group from the beginning, isolation as named (kafkajs's
 *            default is read_committed). Prints every record {event: "record", partition,
 *            offset, key, value}; once `count` arrived it reads `graceMs` more (what should
 *            not be there would show), then prints {event: "end", reason, read}.
 * transform  {brokers, input, output, groupId, transactionalId, perTxn, abortAfter?,
 *             until, timeoutMs}
 *            Consume-transform-produce: a consumer of `input` (eachBatch, autoCommit off,
 *            read_committed) and a transactional producer. Up to `perTxn` records of a
 *            batch make one transaction: their values upper-cased go to the same partition
 *            of `output`, and the offset after the last is committed for the group with
 *            sendOffsets, then the transaction commits. With `abortAfter`, the transaction
 *            after that many commits is aborted instead (records sent, offsets sent) and the
 *            run stops there. Prints {event: "txn", end, partition, first, last} per
 *            transaction and {event: "end", reason}; stops after the abort, once the
 *            committed offsets reach `until` ({partition: offset}), or at `timeoutMs`.
 */

const { print, client, describeError, runCommand } = require('./kafkajs_common')

function transactionalProducer (kafka, transactionalId) {
  // kafkajs's transactional producers must be idempotent with one request in flight.
  // Retries bounded (about 15 s; kafkajs warns that this weakens EoS): a test wants an end,
  // not a hang, but InitProducerId is retried on CONCURRENT_TRANSACTIONS while the
  // coordinator aborts a fenced producer's transaction.
  return kafka.producer({
    transactionalId,
    idempotent: true,
    maxInFlightRequests: 1,
    retry: { retries: 10, initialRetryTime: 100, maxRetryTime: 2000 }
  })
}

// kafkajs wraps a broker's error code (KafkaJSProtocolError, with `type`) in retry and
// non-retriable errors: the first `type` found, depth first, is the Kafka error.
function errorType (e) {
  if (!e || typeof e !== 'object') return null
  if (e.type) return e.type
  for (const inner of [e.cause, ...(Array.isArray(e.errors) ? e.errors : [])]) {
    const found = errorType(inner)
    if (found) return found
  }
  return null
}

const asMessage = m => ({ partition: m.partition, key: m.key ?? null, value: m.value ?? null })

async function script (spec) {
  const kafka = client(spec, 'kiln-compat-kafkajs-txn')
  const producers = {}
  for (const [name, transactionalId] of Object.entries(spec.producers)) {
    producers[name] = transactionalProducer(kafka, transactionalId)
    await producers[name].connect()
  }
  const open = {}
  try {
    for (const [index, step] of spec.steps.entries()) {
      const { producer: name, action } = step
      const out = { event: 'step', index, producer: name, action }
      try {
        if (action === 'begin') {
          open[name] = await producers[name].transaction()
        } else if (action === 'send') {
          const messages = step.messages.map(asMessage)
          const answers = await open[name].send({ topic: spec.topic, messages })
          out.acks = offsetsOf(messages, answers)
        } else if (action === 'sendOffsets') {
          await open[name].sendOffsets({
            consumerGroupId: step.groupId,
            topics: [{
              topic: spec.topic,
              partitions: Object.entries(step.offsets).map(([partition, offset]) => ({
                partition: Number(partition), offset: String(offset)
              }))
            }]
          })
        } else if (action === 'commit') {
          await open[name].commit()
        } else if (action === 'abort') {
          await open[name].abort()
        } else {
          throw new Error(`unknown action ${action}`)
        }
        print({ ...out, ok: true })
      } catch (e) {
        print({ ...out, ok: false, errorType: errorType(e), error: describeError(e) })
      }
    }
  } finally {
    await Promise.all(Object.values(producers).map(p => p.disconnect()))
  }
}

// A send is answered with one base offset per partition; a message's offset is that plus
// its place among the send's messages for the partition.
function offsetsOf (messages, answers) {
  const base = new Map(answers.map(a => [a.partition, BigInt(a.baseOffset)]))
  const seen = new Map()
  return messages.map(({ partition }) => {
    const before = seen.get(partition) || 0n
    seen.set(partition, before + 1n)
    return { partition, offset: Number(base.get(partition) + before) }
  })
}

async function read (spec) {
  const consumer = client(spec, 'kiln-compat-kafkajs-txn-reader').consumer({
    groupId: spec.groupId,
    readUncommitted: Boolean(spec.readUncommitted),
    sessionTimeout: 10000,
    heartbeatInterval: 500,
    maxWaitTimeInMs: 200,
    allowAutoTopicCreation: false
  })
  let count = 0
  let finish
  const finished = new Promise(resolve => { finish = resolve })
  await consumer.connect()
  await consumer.subscribe({ topics: [spec.topic], fromBeginning: true })
  await consumer.run({
    autoCommit: false,
    eachMessage: async ({ partition, message }) => {
      count += 1
      print({
        event: 'record',
        partition,
        offset: Number(message.offset),
        key: message.key === null ? null : message.key.toString(),
        value: message.value === null ? null : message.value.toString()
      })
      if (count === spec.count) setTimeout(() => finish('count'), spec.graceMs || 1000)
    }
  })
  if (spec.count === 0) setTimeout(() => finish('count'), spec.graceMs || 1000)
  const timer = setTimeout(() => finish('timeout'), spec.timeoutMs || 30000)
  const reason = await finished
  clearTimeout(timer)
  await consumer.disconnect()
  print({ event: 'end', reason, read: count })
}

async function transform (spec) {
  const kafka = client(spec, 'kiln-compat-kafkajs-transform')
  const producer = transactionalProducer(kafka, spec.transactionalId)
  const consumer = kafka.consumer({
    groupId: spec.groupId,
    sessionTimeout: 10000,
    heartbeatInterval: 500,
    maxWaitTimeInMs: 200,
    allowAutoTopicCreation: false
  })
  const committedTo = {}
  let commits = 0
  let stopped = false
  let finish
  const finished = new Promise(resolve => { finish = resolve })
  const stop = reason => { stopped = true; finish(reason) }
  const reachedUntil = () => Object.entries(spec.until)
    .every(([partition, offset]) => (committedTo[partition] ?? -1) >= offset)

  consumer.on(consumer.events.CRASH, ({ payload }) => {
    print({ event: 'error', error: describeError(payload.error) })
    stop('crash')
  })
  await producer.connect()
  await consumer.connect()
  await consumer.subscribe({ topics: [spec.input], fromBeginning: true })
  await consumer.run({
    autoCommit: false,
    eachBatchAutoResolve: false,
    eachBatch: async ({ batch, resolveOffset, heartbeat, isRunning, isStale }) => {
      const { partition, messages } = batch
      for (let start = 0; start < messages.length; start += spec.perTxn) {
        if (stopped || !isRunning() || isStale()) return
        const chunk = messages.slice(start, start + spec.perTxn)
        const first = Number(chunk[0].offset)
        const last = Number(chunk[chunk.length - 1].offset)
        const abort = spec.abortAfter !== undefined && commits === spec.abortAfter
        const txn = await producer.transaction()
        try {
          await txn.send({
            topic: spec.output,
            messages: chunk.map(m => ({
              partition,
              key: m.key,
              value: m.value === null ? null : m.value.toString().toUpperCase()
            }))
          })
          await txn.sendOffsets({
            consumerGroupId: spec.groupId,
            topics: [{ topic: spec.input, partitions: [{ partition, offset: String(last + 1) }] }]
          })
          if (abort) await txn.abort()
          else await txn.commit()
        } catch (e) {
          if (txn.isActive()) await txn.abort()
          throw e
        }
        print({ event: 'txn', end: abort ? 'abort' : 'commit', partition, first, last })
        if (abort) {
          stop('aborted')
          return
        }
        commits += 1
        committedTo[partition] = last + 1
        resolveOffset(chunk[chunk.length - 1].offset)
        await heartbeat()
        if (reachedUntil()) {
          stop('until')
          return
        }
      }
    }
  })
  const timer = setTimeout(() => stop('timeout'), spec.timeoutMs || 30000)
  const reason = await finished
  clearTimeout(timer)
  await consumer.disconnect()
  await producer.disconnect()
  print({ event: 'end', reason })
  return reason === 'crash'
}

runCommand({ script, read, transform })
