// KafkaJS's transactions against one broker: node transactions.js BOOTSTRAP PREFIX
//
// Run by tests/test_kafkajs_transactions.py, which installs kafkajs (package.json, package-lock.json) and
// points NODE_PATH at it. Three writers use KafkaJS's own transactional API (producer.transaction(), send,
// sendOffsets, commit, abort), then a read_committed and a read_uncommitted consumer read every topic they
// wrote. Each step's outcome goes into one JSON document on stdout, errors included (their class name, Kafka
// error type and cause), so the Python test makes every assertion and names what differed.
'use strict'

const { Kafka, Partitioners, logLevel } = require('kafkajs')

const [bootstrap, prefix] = process.argv.slice(2)
if (!bootstrap || !prefix) {
  console.error('usage: node transactions.js BOOTSTRAP PREFIX')
  process.exit(2)
}

// The topics, by role, and their partition counts.
const TOPICS = {
  a: { name: `${prefix}-a`, partitions: 2 },
  b: { name: `${prefix}-b`, partitions: 1 },
  input: { name: `${prefix}-in`, partitions: 1 },
  output: { name: `${prefix}-out`, partitions: 1 },
  zombie: { name: `${prefix}-zombie`, partitions: 2 },
}
// The transactions of the first writer, in order, and how each ends: the last commits, so a reader that has
// seen its records has read past the aborted one in every partition.
const ROUNDS = [['committed-1', 'commit'], ['aborted', 'abort'], ['committed-2', 'commit']]
// What the consume-transform-produce loop reads; the first try at INPUT_ABORTED aborts, the second commits.
const INPUTS = ['in0', 'in1', 'in2', 'in3']
const INPUT_ABORTED = 'in1'
// How long a consumer waits for the records it must see; the test's own timeout is longer, so a miss is
// reported with what was seen.
const CONSUME_TIMEOUT_MS = 60000
// Every record names its partition; the partitioner is named only to keep KafkaJS 2's warning about its
// default off stderr.
const PRODUCER = { createPartitioner: Partitioners.DefaultPartitioner }
// KafkaJS asks for these on a transactional producer (idempotence needs one request in flight).
const TRANSACTIONAL = { ...PRODUCER, idempotent: true, maxInFlightRequests: 1 }

const kafka = new Kafka({ clientId: 'stratalog-kafkajs-transactions', brokers: [bootstrap],
  logLevel: logLevel.WARN })

function errorOf (e) {
  if (e === undefined || e === null) return null
  return { name: e.name, type: e.type === undefined ? null : e.type, code: e.code === undefined ? null : e.code,
    retriable: e.retriable === undefined ? null : e.retriable, message: e.message,
    cause: e.cause === e ? null : errorOf(e.cause) }
}

// null if ``promise`` resolves, else what it was rejected with.
async function refusal (promise) {
  try {
    await promise
    return null
  } catch (e) {
    return errorOf(e)
  }
}

function sentOf (results) {
  return results.map(r => ({ topicName: r.topicName, partition: r.partition, errorCode: r.errorCode }))
}

async function createTopics () {
  const admin = kafka.admin()
  await admin.connect()
  try {
    return await admin.createTopics({ waitForLeaders: true, topics: Object.values(TOPICS).map(t => ({
      topic: t.name, numPartitions: t.partitions })) })
  } finally {
    await admin.disconnect()
  }
}

// One transaction per round, each to both partitions of ``a`` and to ``b``, ended as the round says.
async function commitAndAbort (seen) {
  const producer = kafka.producer({ ...TRANSACTIONAL, transactionalId: `${prefix}-writer` })
  await producer.connect()
  seen.rounds = []
  try {
    for (const [round, end] of ROUNDS) {
      const txn = await producer.transaction()
      const sent = await txn.send({ topic: TOPICS.a.name, messages: [
        { partition: 0, value: `${round}-a0` }, { partition: 1, value: `${round}-a1` }] })
      sent.push(...await txn.send({ topic: TOPICS.b.name, messages: [{ partition: 0, value: `${round}-b0` }] }))
      await txn[end]()
      seen.rounds.push({ round, end, sent: sentOf(sent), active: txn.isActive() })
    }
  } finally {
    await producer.disconnect()
  }
}

async function committedOffset (admin, groupId) {
  const [topic] = await admin.fetchOffsets({ groupId, topics: [TOPICS.input.name] })
  return topic.partitions.map(p => ({ partition: p.partition, offset: p.offset }))
}

// One input record through one transaction: its output sent, its offset sent with it, the group's offset
// read before and after the transaction ends.
async function transform (producer, admin, groupId, { partition, message }, end) {
  const txn = await producer.transaction()
  const value = message.value.toString()
  const suffix = end === 'abort' ? '-out-aborted' : '-out'
  await txn.send({ topic: TOPICS.output.name, messages: [{ partition: 0, value: value + suffix }] })
  const offset = String(Number(message.offset) + 1)
  await txn.sendOffsets({ consumerGroupId: groupId, topics: [{ topic: TOPICS.input.name,
    partitions: [{ partition, offset }] }] })
  const pending = await committedOffset(admin, groupId)
  await txn[end]()
  return { input: value, end, sentOffset: offset, pending, ended: await committedOffset(admin, groupId) }
}

// Consume-transform-produce: each input read by a group member, its output and its next offset sent in a
// transaction of the writer's; the group never commits on its own.
async function consumeTransformProduce (seen) {
  const groupId = `${prefix}-ctp`
  seen.ctpGroup = groupId
  const plain = kafka.producer(PRODUCER)
  await plain.connect()
  try {
    await plain.send({ topic: TOPICS.input.name, messages: INPUTS.map(value => ({ partition: 0, value })) })
  } finally {
    await plain.disconnect()
  }
  const admin = kafka.admin()
  const producer = kafka.producer({ ...TRANSACTIONAL, transactionalId: `${prefix}-ctp-writer` })
  const consumer = kafka.consumer({ groupId, readUncommitted: false })
  await Promise.all([admin.connect(), producer.connect(), consumer.connect()])
  seen.ctp = []
  try {
    seen.ctpBefore = await committedOffset(admin, groupId)
    await consumer.subscribe({ topic: TOPICS.input.name, fromBeginning: true })
    await within(`transformed ${INPUTS.length} inputs`, () => seen.ctp.length, (resolve, reject) =>
      consumer.run({ autoCommit: false, eachMessage: async payload => {
        if (payload.message.value.toString() === INPUT_ABORTED && !seen.ctp.some(t => t.end === 'abort')) {
          seen.ctp.push(await transform(producer, admin, groupId, payload, 'abort'))
        }
        seen.ctp.push(await transform(producer, admin, groupId, payload, 'commit'))
        if (seen.ctp.filter(t => t.end === 'commit').length === INPUTS.length) resolve()
      } }).catch(reject))
    await consumer.stop()
    seen.ctpAfter = await committedOffset(admin, groupId)
  } finally {
    await Promise.all([consumer.disconnect(), producer.disconnect(), admin.disconnect()])
  }
}

// Two producers of one transactional id: the second's init fences the first, whose every later request fails.
async function zombie (seen) {
  const transactionalId = `${prefix}-zombie-writer`
  const first = kafka.producer({ ...TRANSACTIONAL, transactionalId })
  const second = kafka.producer({ ...TRANSACTIONAL, transactionalId })
  await Promise.all([first.connect(), second.connect()])
  try {
    const stale = await first.transaction()
    seen.beforeFence = sentOf(await stale.send({ topic: TOPICS.zombie.name,
      messages: [{ partition: 0, value: 'first-before-fence' }] }))
    const fresh = await second.transaction()   // InitProducerId: a new epoch, the first's transaction aborted
    seen.fencedSend = await refusal(stale.send({ topic: TOPICS.zombie.name,
      messages: [{ partition: 0, value: 'first-after-fence' }] }))
    // A partition the stale transaction has not added yet: AddPartitionsToTxn, not Produce, is refused.
    seen.fencedAddPartition = await refusal(stale.send({ topic: TOPICS.zombie.name,
      messages: [{ partition: 1, value: 'first-new-partition' }] }))
    seen.fencedCommit = await refusal(stale.commit())
    seen.afterFence = sentOf(await fresh.send({ topic: TOPICS.zombie.name, messages: [
      { partition: 0, value: 'second-p0' }, { partition: 1, value: 'second-p1' }] }))
    await fresh.commit()
  } finally {
    await Promise.all([first.disconnect(), second.disconnect()])
  }
}

// The time a step waits for records ran out (what it saw is in the error's message).
class TimedOut extends Error {}

// Resolves once ``start``'s work calls resolve; rejects with TimedOut after CONSUME_TIMEOUT_MS, naming ``what``
// and ``progress()``.
function within (what, progress, start) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new TimedOut(`${what}: got ${progress()} in ${CONSUME_TIMEOUT_MS} ms`)),
      CONSUME_TIMEOUT_MS)
    start(() => { clearTimeout(timer); resolve() }, e => { clearTimeout(timer); reject(e) })
  })
}

// Every record of every topic, as a consumer of one isolation level reads them, until it has seen each of
// ``lasts`` (topic -> partition -> value, the last committed value there): records come in offset order per
// partition, so whatever lies before them has been read by then. Whether it saw them all in time is returned,
// not thrown: the test compares what it read with what it should have.
async function readAll (readUncommitted, lasts, got) {
  const consumer = kafka.consumer({ groupId: `${prefix}-read-${readUncommitted ? 'uncommitted' : 'committed'}`,
    readUncommitted })
  const pending = new Set(Object.entries(lasts).flatMap(([topic, parts]) =>
    Object.entries(parts).map(([partition, value]) => `${topic}/${partition}/${value}`)))
  await consumer.connect()
  try {
    await consumer.subscribe({ topics: Object.keys(lasts), fromBeginning: true })
    await within(`read ${readUncommitted ? 'uncommitted' : 'committed'}`, () => got.length,
      (resolve, reject) => consumer.run({ eachMessage: async ({ topic, partition, message }) => {
        const value = message.value.toString()
        got.push({ topic, partition, offset: message.offset, value })
        pending.delete(`${topic}/${partition}/${value}`)
        if (pending.size === 0) resolve()
      } }).catch(reject))
  } catch (e) {
    if (!(e instanceof TimedOut)) throw e
  } finally {
    await consumer.disconnect()
  }
  return [...pending]
}

function lastCommitted () {
  const last = ROUNDS[ROUNDS.length - 1][0]
  return {
    [TOPICS.a.name]: { 0: `${last}-a0`, 1: `${last}-a1` },
    [TOPICS.b.name]: { 0: `${last}-b0` },
    [TOPICS.output.name]: { 0: `${INPUTS[INPUTS.length - 1]}-out` },
    [TOPICS.zombie.name]: { 0: 'second-p0', 1: 'second-p1' },
  }
}

async function main (seen) {
  seen.topics = Object.fromEntries(Object.entries(TOPICS).map(([role, t]) => [role, t.name]))
  seen.created = await createTopics()
  await commitAndAbort(seen)
  await consumeTransformProduce(seen)
  await zombie(seen)
  seen.readCommitted = []
  seen.readCommittedMissing = await readAll(false, lastCommitted(), seen.readCommitted)
  seen.readUncommitted = []
  seen.readUncommittedMissing = await readAll(true, lastCommitted(), seen.readUncommitted)
}

// What was seen up to a failure is printed with it, so the test's message shows how far the steps got.
const seen = {}
main(seen).then(
  () => { process.stdout.write(JSON.stringify(seen) + '\n') },
  e => {
    process.stdout.write(JSON.stringify({ ...seen, failed: errorOf(e), stack: e.stack }) + '\n')
    process.exitCode = 1
  })
