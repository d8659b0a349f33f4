// Waiting and yielding that a background tab does not stall (docs/ARCHITECTURE.md "Background
// tabs"). In a hidden page Chromium wakes timers (setTimeout, setInterval) at most once a
// second and runs no animation frames; message events, fetch answers and data channel messages
// still arrive at once. So nothing on a run's path waits on a timer to make progress: it yields
// through a MessageChannel and waits on events, and its timers are only deadlines, which may
// fire late (coarse) without changing what happens.
//
//   await yieldToPage()                    lets the page's other tasks run (a message task, not a timer)
//   await waitUntil(ready, ms, ...subs)    true as soon as ready(), checked on every event that a
//                                          sub (wake) => off delivers; false once ms passed without it

// The yield: a message posted to ourselves is a new task (the page's input, network and data
// channel tasks run before it) that Chromium does not throttle in a hidden page. Node (the CLI,
// tests) has setImmediate, which needs no port that could keep the process alive.
let channel = null;
const waiting = [];                       // resolvers, in the order their messages were posted

export function yieldToPage() {
  if (typeof setImmediate === 'function') return new Promise((resolve) => setImmediate(resolve));
  if (!channel) {
    channel = new MessageChannel();
    channel.port1.onmessage = () => waiting.shift()?.();
  }
  return new Promise((resolve) => {
    waiting.push(resolve);
    channel.port2.postMessage(null);
  });
}

// ready: () => boolean, checked at once, on every wake from a sub, and at the deadline.
// subs: functions (wake) => off that call wake on the events that can make ready() true (a
// mesh.on or bus.on registration). The deadline is a timer: in a hidden page it fires late,
// which only lengthens the wait for something that never came.
export function waitUntil(ready, timeoutMs, ...subs) {
  if (ready()) return Promise.resolve(true);
  return new Promise((resolve) => {
    const offs = [];
    let timer = null, done = false;
    const finish = (value) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      for (const off of offs.splice(0)) off();
      resolve(value);
    };
    const wake = () => { if (ready()) finish(true); };
    for (const sub of subs) offs.push(sub(wake));
    if (done) for (const off of offs.splice(0)) off();          // woken while subscribing
    else timer = setTimeout(() => finish(ready()), timeoutMs);
  });
}
