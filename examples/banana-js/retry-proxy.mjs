// A proxy in front of inferd that answers the first request to a path ending
// in /second with HTTP 503 and passes every other request on: client.test.js
// checks that the Banana Client retries it and that the model runs once.
//   node retry-proxy.mjs PORT TARGET   (TARGET: http://127.0.0.1:8080)
// It prints "listening" once it accepts connections.
import http from 'node:http';

const [port, target] = process.argv.slice(2);
let forced = false;
http.createServer(async (req, res) => {
  const chunks = [];
  for await (const c of req) chunks.push(c);
  const headers = { ...req.headers };
  for (const hop of ['host', 'connection', 'keep-alive', 'transfer-encoding', 'content-length']) delete headers[hop];
  let upstream, body;
  try {
    upstream = await fetch(target + req.url, {
      method: req.method, headers, body: chunks.length ? Buffer.concat(chunks) : undefined,
    });
    body = Buffer.from(await upstream.arrayBuffer());
  } catch (err) {
    res.writeHead(502, { 'Content-Type': 'text/plain' });
    res.end(`retry proxy: ${err.cause?.message || err.message}`);
    return;
  }
  if (req.url.endsWith('/second') && !forced) {
    forced = true;
    res.writeHead(503, { 'Content-Type': 'text/plain' });
    res.end('forced by the retry proxy');
    return;
  }
  res.writeHead(upstream.status, { 'Content-Type': upstream.headers.get('content-type') || 'application/json' });
  res.end(body);
}).listen(Number(port), '127.0.0.1', () => console.log('listening'));
