// KafkaJS's admin client against one broker: node admin.js BOOTSTRAP TOPIC
//
// Run by tests/test_kafkajs_admin.py, which installs kafkajs (package.json, package-lock.json) and points
// NODE_PATH at it. Each step's outcome goes into one JSON document on stdout, errors included (their
// class name and Kafka error type), so the Python test makes every assertion and names what differed.
'use strict'

const { Kafka, ConfigResourceTypes, Partitioners, logLevel } = require('kafkajs')

const [bootstrap, topic] = process.argv.slice(2)
if (!bootstrap || !topic) {
  console.error('usage: node admin.js BOOTSTRAP TOPIC')
  process.exit(2)
}

// The configs the test sets on the compacted topic and reads back.
const TOPIC_CONFIGS = {
  'cleanup.policy': 'compact',
  'retention.ms': '3600000',
  'min.cleanable.dirty.ratio': '0.25',
}
// Keyed records produced to the compacted topic and consumed back.
const RECORDS = [
  { key: 'k1', value: 'v1' },
  { key: 'k2', value: 'v2' },
  { key: 'k1', value: 'v1-again' },
]
// How long the consumer waits for the records; the test's own timeout is longer, so a miss is reported.
const CONSUME_TIMEOUT_MS = 60000

const kafka = new Kafka({ clientId: 'stratalog-kafkajs-admin', brokers: [bootstrap], logLevel: logLevel.WARN })

function errorOf (e) {
  return { name: e.name, type: e.type === undefined ? null : e.type, code: e.code === undefined ? null : e.code,
    retriable: e.retriable === undefined ? null : e.retriable, message: e.message }
}

function entriesOf (resource) {
  const configs = {}
  for (const entry of resource.configEntries) {
    configs[entry.configName] = { value: entry.configValue, isDefault: entry.isDefault,
      readOnly: entry.readOnly, configSource: entry.configSource }
  }
  return { errorCode: resource.errorCode, resourceType: resource.resourceType,
    resourceName: resource.resourceName, configs }
}

async function refusal (admin, configEntries, name = topic) {
  try {
    await admin.alterConfigs({ resources: [{ type: ConfigResourceTypes.TOPIC, name, configEntries }] })
    return null
  } catch (e) {
    return errorOf(e)
  }
}

async function adminSteps (admin, seen) {
  seen.created = await admin.createTopics({ topics: [{ topic, numPartitions: 1 }], waitForLeaders: true })
  const cluster = await admin.describeCluster()
  seen.cluster = { controller: cluster.controller, brokers: cluster.brokers.map(b => b.nodeId) }
  const configEntries = Object.entries(TOPIC_CONFIGS).map(([name, value]) => ({ name, value }))
  const altered = await admin.alterConfigs({ resources: [{ type: ConfigResourceTypes.TOPIC, name: topic,
    configEntries }] })
  seen.altered = altered.resources.map(r => ({ errorCode: r.errorCode, resourceName: r.resourceName }))
  const topicConfigs = await admin.describeConfigs({ includeSynonyms: false,
    resources: [{ type: ConfigResourceTypes.TOPIC, name: topic }] })
  seen.topicConfigs = topicConfigs.resources.map(entriesOf)
  const brokerConfigs = await admin.describeConfigs({ includeSynonyms: false,
    resources: [{ type: ConfigResourceTypes.BROKER, name: String(cluster.brokers[0].nodeId) }] })
  seen.brokerConfigs = brokerConfigs.resources.map(entriesOf)
  seen.invalidValue = await refusal(admin, [{ name: 'cleanup.policy', value: 'bogus' }])
  seen.unknownName = await refusal(admin, [{ name: 'no.such.config', value: '1' }])
  seen.unknownTopic = await refusal(admin, [{ name: 'retention.ms', value: '1000' }], `${topic}-missing`)
  const after = await admin.describeConfigs({ includeSynonyms: false,
    resources: [{ type: ConfigResourceTypes.TOPIC, name: topic }] })
  seen.topicConfigsAfterRefusals = after.resources.map(entriesOf)
}

async function produce (seen) {
  const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner })
  await producer.connect()
  try {
    const sent = await producer.send({ topic, messages: RECORDS })
    seen.produced = sent.map(r => ({ errorCode: r.errorCode, baseOffset: r.baseOffset }))
  } finally {
    await producer.disconnect()
  }
}

async function consume (seen) {
  const consumer = kafka.consumer({ groupId: `${topic}-reader` })
  const got = []
  await consumer.connect()
  try {
    await consumer.subscribe({ topic, fromBeginning: true })
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`consumed ${got.length} of ${RECORDS.length} records ` +
        `in ${CONSUME_TIMEOUT_MS} ms`)), CONSUME_TIMEOUT_MS)
      consumer.run({
        eachMessage: async ({ message }) => {
          got.push({ offset: message.offset, key: message.key.toString(), value: message.value.toString() })
          if (got.length >= RECORDS.length) {
            clearTimeout(timer)
            resolve()
          }
        },
      }).catch(reject)
    })
  } finally {
    seen.consumed = got
    await consumer.disconnect()
  }
}

async function main (seen) {
  const admin = kafka.admin()
  await admin.connect()
  try {
    await adminSteps(admin, seen)
  } finally {
    await admin.disconnect()
  }
  await produce(seen)
  await consume(seen)
}

// What was seen up to a failure is printed with it, so the test's message shows how far the steps got.
const seen = {}
main(seen).then(
  () => { process.stdout.write(JSON.stringify(seen) + '\n') },
  e => {
    process.stdout.write(JSON.stringify({ ...seen, failed: errorOf(e), stack: e.stack }) + '\n')
    process.exitCode = 1
  })
