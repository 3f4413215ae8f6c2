// Verifies deliveries with the official Standard Webhooks library (npm `standardwebhooks`).
// Usage: node verify_standard_webhooks.mjs CASES.json (the same cases as the Python tool's);
// prints a JSON list, one entry per case: null when the library verified it, else its error.
import { readFileSync } from "node:fs";
import { Webhook } from "standardwebhooks";

const cases = JSON.parse(readFileSync(process.argv[2], "utf8"));
const out = cases.map((c) => {
  try {
    // The payloads are XML: verified, not parsed as JSON.
    new Webhook(c.secret).verify(Buffer.from(c.body_b64, "base64").toString("utf8"), c.headers, {
      jsonParse: false,
    });
    return null;
  } catch (e) {
    return `${e.name}: ${e.message}`;
  }
});
process.stdout.write(JSON.stringify(out));
