// BullMQ contender: one Worker with concurrency 10, otherwise BullMQ's defaults.
//
// Runs with the machine's node, from this directory's node_modules (npm ci).
// Speaks the harness's line protocol (bench/peers/contenders/protocol.py):
// enqueue N, "ready"; on "go" start the worker and wait for N finished jobs
// ("completed"/"failed" events, emitted after BullMQ's own finish call
// returned), "drained"; on "verify" stop the worker and report what
// Queue.getJobCounts / getCompletedCount say.
import { Queue, Worker } from 'bullmq';
import readline from 'node:readline';
import { parseArgs } from 'node:util';
import { performance } from 'node:perf_hooks';

const TAG = '@@peers ';
const emit = (event, fields = {}) => process.stdout.write(TAG + JSON.stringify({ event, ...fields }) + '\n');

const { values: a } = parseArgs({
  options: {
    url: { type: 'string' },
    n: { type: 'string' },
    concurrency: { type: 'string', default: '10' },
    timeout: { type: 'string', default: '300' },
    queue: { type: 'string', default: 'bench' },
    enqueue: { type: 'string' },
    'until-stop': { type: 'boolean', default: false },
  },
});
const n = Number(a.n);
// Several processes on one queue (bench/saturation.py): this one enqueues `enqueue` jobs
// (the first all N, the others none) and drains until the harness says stop.
const enqueue = a.enqueue === undefined ? n : Number(a.enqueue);
const concurrency = Number(a.concurrency);
const timeoutMs = Number(a.timeout) * 1000;
const url = new URL(a.url);
const connection = { host: url.hostname, port: Number(url.port), maxRetriesPerRequest: null };

const lines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();
async function expect(word) {
  const { value, done } = await lines.next();
  if (done) throw new Error(`harness closed stdin while waiting for ${word}`);
  if (value.trim() !== word) throw new Error(`expected ${word} from the harness, got ${value.trim()}`);
}

async function main() {
  const queue = new Queue(a.queue, { connection });
  const t = performance.now();
  for (let k = 0; k < enqueue; k += 1000) {
    const jobs = [];
    for (let i = k; i < Math.min(enqueue, k + 1000); i++) jobs.push({ name: 'noop', data: {}, opts: { jobId: `j${i}` } });
    await queue.addBulk(jobs);
  }
  emit('ready', { enqueued: await queue.count(), enqueue_s: (performance.now() - t) / 1000 });
  await expect('go');
  const t0 = performance.now();
  let finished = 0;
  let drained;
  const done = new Promise((resolve) => { drained = resolve; });
  const onFinished = () => { if (++finished >= n) drained(); };
  const worker = new Worker(a.queue, async () => null, { connection, concurrency });
  worker.on('completed', onFinished);
  worker.on('failed', onFinished);
  worker.on('error', (err) => process.stderr.write(`bullmq worker error: ${err}\n`));
  let timer;
  const end = a['until-stop'] ? expect('stop') : done;
  await Promise.race([end, new Promise((resolve) => { timer = setTimeout(resolve, timeoutMs); })]);
  clearTimeout(timer);
  const timedOut = !a['until-stop'] && finished < n;
  emit('drained', { elapsed_s: (performance.now() - t0) / 1000, processed: finished, timed_out: timedOut });
  await expect('verify');
  await worker.close();
  const kinds = ['completed', 'failed', 'active', 'waiting', 'delayed', 'prioritized', 'waiting-children', 'paused'];
  const counts = await queue.getJobCounts(...kinds);
  const completed = await queue.getCompletedCount();
  const known = kinds.reduce((s, k) => s + (counts[k] || 0), 0);
  const other = {};
  for (const k of kinds.slice(2)) if (counts[k]) other[k] = counts[k];
  emit('verified', {
    done: completed, failed: counts.failed, missing: Math.max(0, n - known), other, counts, processed: finished,
  });
  await queue.close();
}

main().then(
  () => process.exit(0),
  (err) => { emit('error', { message: String(err && err.stack ? err.stack : err) }); process.exit(1); },
);
