'use strict'
/*
 * kafkajs over TLS, driven by tests/compat/test_tls_clients.py: `node kafkajs_tls.js COMMAND`
 * reads one JSON object on stdin and prints one JSON object per line on stdout, as
 * kafkajs_driver.js does (kafkajs_common.js runs the command). Every spec names the PEM files
 * of its TLS settings, `tls: {ca, cert?, key?}` (cert and key: a client certificate, for a
 * listener that requires one); kafkajs checks the certificate and its address against `ca`.
 *
 * produce  {brokers, tls, topic, values: [string], retry?}
 *          One send of every value to partition 0, acks=all; prints
 *          {event: "ack", index, partition, offset} per value.
 * consume  {brokers, tls, topic, groupId, count, timeoutMs}
 *          One group member from the beginning of the topic; prints
 *          {event: "record", partition, offset, value} per record, then
 *          {event: "end", reason, read} once `count` arrived (reason "count") or at
 *          `timeoutMs` ("timeout").
 * topics   {brokers, tls, retry?}
 *          Prints {event: "topics", topics} (admin listTopics).
 */

const fs = require('fs')
const { Kafka, logLevel } = require('kafkajs')
const { print, runCommand } = require('./kafkajs_common')

function tlsClient (spec, clientId) {
  const { ca, cert, key } = spec.tls
  const ssl = { ca: [fs.readFileSync(ca)] }
  if (cert) ssl.cert = fs.readFileSync(cert)
  if (key) ssl.key = fs.readFileSync(key)
  return new Kafka({
    clientId,
    brokers: spec.brokers,
    ssl,
    // WARN and ERROR only: kafkajs's console logger writes those to stderr, not stdout.
    logLevel: logLevel.WARN,
    // Bounded, so a connection that never works fails within the test's timeout.
    connectionTimeout: 5000,
    requestTimeout: 15000,
    retry: { retries: 5, initialRetryTime: 100, maxRetryTime: 2000, ...(spec.retry || {}) }
  })
}

async function produce (spec) {
  const producer = tlsClient(spec, 'kiln-compat-kafkajs-tls-producer').producer()
  await producer.connect()
  try {
    const [answer] = await producer.send({
      topic: spec.topic,
      messages: spec.values.map(value => ({ value, partition: 0 })),
      acks: -1,
      timeout: 15000
    })
    spec.values.forEach((_value, index) => print({
      event: 'ack', index, partition: answer.partition, offset: Number(answer.baseOffset) + index
    }))
  } finally {
    await producer.disconnect()
  }
}

async function consume (spec) {
  const consumer = tlsClient(spec, 'kiln-compat-kafkajs-tls-consumer').consumer({
    groupId: spec.groupId, maxWaitTimeInMs: 200, allowAutoTopicCreation: false
  })
  let read = 0
  let finish
  const finished = new Promise(resolve => { finish = resolve })
  await consumer.connect()
  const timer = setTimeout(() => finish('timeout'), spec.timeoutMs || 30000)
  try {
    await consumer.subscribe({ topics: [spec.topic], fromBeginning: true })
    await consumer.run({
      eachMessage: async ({ partition, message }) => {
        if (read >= spec.count) return
        read += 1
        print({
          event: 'record', partition, offset: Number(message.offset),
          value: message.value === null ? null : message.value.toString()
        })
        if (read >= spec.count) finish('count')
      }
    })
    print({ event: 'end', reason: await finished, read })
  } finally {
    clearTimeout(timer)
    await consumer.disconnect()
  }
}

async function topics (spec) {
  const admin = tlsClient(spec, 'kiln-compat-kafkajs-tls-admin').admin()
  await admin.connect()
  try {
    print({ event: 'topics', topics: await admin.listTopics() })
  } finally {
    await admin.disconnect()
  }
}

runCommand({ produce, consume, topics })
