// Offline checks of kvrm's deployment files, run by the sh_tests in deploy/BUILD.bazel.
//
//   node check.js manifests ROOT   kubectl-kustomize every overlay, validate each object against
//                                  the Kubernetes / Prometheus Operator API schemas
//                                  (kubernetes-models), PrometheusRule == monitoring rules,
//                                  promtool check rules on the embedded rules
//   node check.js drift ROOT KVRMD  manifests vs. kvrmd's real flags, ports and drain time
//   node check.js docker ROOT       Dockerfiles build with exactly the commands CI/README run
//
// ROOT is the workspace (the sh_test passes the real source tree: node_modules lives there and
// is no Bazel target). Every failed check is printed; the exit status is 1 if any failed.
"use strict";

const { execFileSync } = require("child_process");
const fs = require("fs");
const os = require("os");
const path = require("path");
const assert = require("assert");
const YAML = require("yaml");

let failures = 0;
function check(ok, what) {
  if (ok) {
    console.log(`ok    ${what}`);
  } else {
    failures++;
    console.log(`FAIL  ${what}`);
  }
  return ok;
}

function run(cmd, args, opts = {}) {
  return execFileSync(cmd, args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], ...opts });
}

function overlays(root) {
  const dir = path.join(root, "deploy/k8s/overlays");
  return fs.readdirSync(dir).filter((d) => fs.existsSync(path.join(dir, d, "kustomization.yaml")));
}

function render(root, overlay) {
  const out = run("kubectl", ["kustomize", path.join(root, "deploy/k8s/overlays", overlay)]);
  return YAML.parseAllDocuments(out).map((d) => d.toJS()).filter((o) => o);
}

// ---------------------------------------------------------------------------------------------
// Schema validation.

// apiVersion -> module exporting one class per kind, each with validate() (throws on error).
const MODULES = {
  "v1": "kubernetes-models/v1",
  "apps/v1": "kubernetes-models/apps/v1",
  "policy/v1": "kubernetes-models/policy/v1",
  "autoscaling/v2": "kubernetes-models/autoscaling/v2",
  "monitoring.coreos.com/v1": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1",
};

// Returns null when valid, else the validator's message.
function schemaError(obj) {
  const mod = MODULES[obj.apiVersion];
  if (!mod) return `no schema module for apiVersion ${obj.apiVersion}`;
  const Kind = require(mod)[obj.kind];
  if (!Kind) return `${obj.apiVersion} has no kind ${obj.kind}`;
  try {
    new Kind(obj).validate();
    return null;
  } catch (e) {
    return e.message;
  }
}

function describe(o) {
  return `${o.kind}/${o.metadata && o.metadata.name}`;
}

function checkManifests(root) {
  const rulesText = fs.readFileSync(path.join(root, "deploy/monitoring/kvrm-rules.yml"), "utf8");
  const rules = YAML.parse(rulesText);
  const wantKinds = ["Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget",
                     "PrometheusRule", "Service", "ServiceMonitor"];
  const tmp = fs.mkdtempSync(path.join(process.env.TEST_TMPDIR || os.tmpdir(), "kvrm-deploy-"));
  // The committed PrometheusRule is what the generator writes from today's rules file.
  const regenerated = path.join(tmp, "prometheusrule.yaml");
  run("bash", [path.join(root, "deploy/k8s/gen-prometheusrule.sh"), regenerated]);
  check(fs.readFileSync(regenerated, "utf8") ===
        fs.readFileSync(path.join(root, "deploy/k8s/base/prometheusrule.yaml"), "utf8"),
        "base/prometheusrule.yaml is up to date (else run deploy/k8s/gen-prometheusrule.sh)");
  const names = overlays(root);
  check(names.includes("cpu") && names.includes("gpu-tp2"), `overlays cpu and gpu-tp2 exist (${names})`);
  for (const overlay of names) {
    let objs;
    try {
      objs = render(root, overlay);
    } catch (e) {
      check(false, `kubectl kustomize ${overlay}: ${e.stderr || e.message}`);
      continue;
    }
    check(objs.length > 0, `kubectl kustomize ${overlay} renders ${objs.length} objects`);
    const kinds = [...new Set(objs.map((o) => o.kind))].sort();
    check(JSON.stringify(kinds) === JSON.stringify(wantKinds), `${overlay}: kinds ${kinds}`);
    check(objs.filter((o) => o.kind === "Service").length === 2, `${overlay}: two Services`);
    check(objs.some((o) => o.kind === "Service" && o.spec.clusterIP === "None"),
          `${overlay}: one Service is headless`);
    for (const o of objs) {
      const err = schemaError(o);
      check(err === null, `${overlay}: ${describe(o)} ${o.apiVersion} validates${err ? ": " + err : ""}`);
    }
    const pr = objs.find((o) => o.kind === "PrometheusRule");
    if (!pr) continue;
    // deepStrictEqual on the parsed YAML: same groups, rules, expressions, labels, annotations.
    let same = true;
    try {
      assert.deepStrictEqual(pr.spec, rules);
    } catch (e) {
      same = false;
    }
    check(same, `${overlay}: PrometheusRule spec equals deploy/monitoring/kvrm-rules.yml ` +
                `(rerun deploy/k8s/gen-prometheusrule.sh if not)`);
    const rulesFile = path.join(tmp, `${overlay}-rules.yml`);
    fs.writeFileSync(rulesFile, YAML.stringify(pr.spec));
    try {
      const out = run("promtool", ["check", "rules", rulesFile]);
      const m = /SUCCESS: (\d+) rules found/.exec(out);
      check(m && Number(m[1]) > 0, `${overlay}: promtool check rules on the PrometheusRule: ${out.trim().split("\n").pop()}`);
    } catch (e) {
      check(false, `${overlay}: promtool check rules: ${e.stdout}${e.stderr}`);
    }
  }
  // Standalone objects shipped beside the kustomization.
  const pvc = YAML.parse(fs.readFileSync(path.join(root, "deploy/k8s/models-pvc.yaml"), "utf8"));
  const pvcErr = schemaError(pvc);
  check(pvcErr === null, `models-pvc.yaml validates${pvcErr ? ": " + pvcErr : ""}`);

  // The validator itself must reject what the API server would: a few broken copies.
  const base = render(root, "cpu");
  const dep = base.find((o) => o.kind === "Deployment");
  const broken = [
    ["a string containerPort", (d) => { d.spec.template.spec.containers[0].ports[0].containerPort = "grpc"; }],
    ["an httpGet probe without a port", (d) => { delete d.spec.template.spec.containers[0].readinessProbe.httpGet.port; }],
    ["no selector", (d) => { delete d.spec.selector; }],
    ["a container without a name", (d) => { delete d.spec.template.spec.containers[0].name; }],
  ];
  for (const [what, mutate] of broken) {
    const copy = structuredClone(dep);
    mutate(copy);
    check(schemaError(copy) !== null, `validator rejects a Deployment with ${what}`);
  }
  const sm = structuredClone(base.find((o) => o.kind === "ServiceMonitor"));
  sm.spec.endpoints[0].interval = 15;
  check(schemaError(sm) !== null, "validator rejects a ServiceMonitor with a numeric interval");
}

// ---------------------------------------------------------------------------------------------
// Drift between the manifests and kvrmd.

// Flags the manifests may use before kvrmd has them. Each entry says why; drop it once kvrmd
// defines the flag (the check prints a note when an entry is no longer needed).
const PENDING_FLAGS = {
  // Flags the manifests use before kvrmd has them (none at present). Each entry says why.
};

// Parses `kvrmd --helpfull` (Abseil): "    --name (help); default: value;" -> {name: default}.
function kvrmdFlags(kvrmd) {
  let out;
  try {
    out = run(kvrmd, ["--helpfull"]);
  } catch (e) {
    out = e.stdout || ""; // Abseil exits 1 after printing help.
  }
  // An entry starts at "    --name (" and runs to the next one; help and default may wrap.
  const flags = {};
  const entries = out.split(/\n(?=    --[A-Za-z0-9_]+ \()/);
  for (const entry of entries) {
    const text = entry.split(/\n\s*\n/)[0].replace(/\s+/g, " ").trim();
    const m = /^--([A-Za-z0-9_]+) \(.*; default: (.*?);$/.exec(text);
    if (m) flags[m[1]] = m[2].replace(/^"(.*)"$/, "$1");
  }
  return flags;
}

function parseArgs(args) {
  const out = {};
  const dup = [];
  for (const a of args) {
    const m = /^--([A-Za-z0-9_]+)(?:=(.*))?$/.exec(a);
    if (!m) {
      out[`?${a}`] = null;
      continue;
    }
    if (m[1] in out) dup.push(m[1]);
    out[m[1]] = m[2] === undefined ? "true" : m[2];
  }
  return { flags: out, dup };
}

function checkDrift(root, kvrmd) {
  const known = kvrmdFlags(kvrmd);
  for (const f of ["model", "listen", "metrics_port", "drain_grace_s", "slots", "device"]) {
    check(f in known, `kvrmd --helpfull lists --${f}`);
  }
  for (const f of Object.keys(PENDING_FLAGS)) {
    if (f in known) console.log(`note  --${f} is now a kvrmd flag: remove it from PENDING_FLAGS`);
  }
  const metricsDoc = fs.readFileSync(path.join(root, "docs/metrics.md"), "utf8");
  for (const overlay of overlays(root)) {
    const objs = render(root, overlay);
    const dep = objs.find((o) => o.kind === "Deployment");
    const pod = dep.spec.template.spec;
    const c = pod.containers.find((x) => x.name === "kvrmd");
    if (!check(c && Array.isArray(c.args), `${overlay}: container kvrmd with args`)) continue;
    const { flags, dup } = parseArgs(c.args);
    check(dup.length === 0, `${overlay}: no flag given twice (${dup})`);
    for (const f of Object.keys(flags)) {
      const ok = f in known || f in PENDING_FLAGS;
      check(ok, `${overlay}: --${f} is a kvrmd flag` +
                (!(f in known) && f in PENDING_FLAGS ? ` (pending: ${PENDING_FLAGS[f]})` : ""));
    }
    const value = (f) => (f in flags ? flags[f] : known[f]);
    const listenPort = Number(/:(\d+)$/.exec(value("listen") || "")?.[1]);
    const metricsPort = Number(value("metrics_port"));
    const ports = Object.fromEntries((c.ports || []).map((p) => [p.name, p.containerPort]));
    check(listenPort > 0 && ports.grpc === listenPort,
          `${overlay}: --listen port ${listenPort} == containerPort grpc ${ports.grpc}`);
    check(metricsPort > 0 && ports.metrics === metricsPort,
          `${overlay}: --metrics_port ${metricsPort} == containerPort metrics ${ports.metrics}`);
    const httpPort = Number(value("http_port"));
    check(httpPort > 0 ? ports.http === httpPort : ports.http === undefined,
          `${overlay}: --http_port ${httpPort} == containerPort http ${ports.http}`);
    // Probes: plain HTTP on the metrics port (they work whatever TLS the gRPC port has):
    // /readyz (ready once every listener is up, 503 from SIGTERM) to start and route,
    // /healthz to restart.
    const wantPath = { startupProbe: "/readyz", readinessProbe: "/readyz", livenessProbe: "/healthz" };
    for (const [probe, path] of Object.entries(wantPath)) {
      const h = c[probe] && c[probe].httpGet;
      const port = h && (typeof h.port === "string" ? ports[h.port] : h.port);
      check(h && port === metricsPort && h.path === path,
            `${overlay}: ${probe} is GET ${path} on the metrics port ${metricsPort}`);
    }
    // Services: every targetPort names a container port, and the numbers line up.
    for (const svc of objs.filter((o) => o.kind === "Service")) {
      const sel = svc.spec.selector || {};
      const podLabels = dep.spec.template.metadata.labels;
      check(Object.entries(sel).every(([k, v]) => podLabels[k] === v),
            `${overlay}: Service ${svc.metadata.name} selects the kvrmd pods`);
      for (const sp of svc.spec.ports) {
        const target = typeof sp.targetPort === "string" ? ports[sp.targetPort] : sp.targetPort;
        const want = { grpc: listenPort, metrics: metricsPort, http: httpPort > 0 ? httpPort : -1 };
        check(target === (sp.name in want ? want[sp.name] : -1),
              `${overlay}: Service ${svc.metadata.name} port ${sp.name} -> container port ${target}`);
      }
    }
    const sm = objs.find((o) => o.kind === "ServiceMonitor");
    const mainSvc = objs.find((o) => o.kind === "Service" && o.spec.clusterIP !== "None");
    const smSelects = (svc) => Object.entries(sm.spec.selector.matchLabels || {})
        .every(([k, v]) => (svc.metadata.labels || {})[k] === v);
    for (const ep of sm.spec.endpoints) {
      const svcPort = mainSvc.spec.ports.find((p) => p.name === ep.port);
      check(smSelects(mainSvc) && svcPort && ports[svcPort.targetPort] === metricsPort && ep.path === "/metrics",
            `${overlay}: ServiceMonitor scrapes ${ep.port}${ep.path} = kvrmd port ${metricsPort}`);
    }
    // Only the Service with the metrics port is scraped (no double counting).
    for (const svc of objs.filter((o) => o.kind === "Service" && smSelects(o))) {
      check(svc.spec.ports.some((p) => p.name === "metrics"),
            `${overlay}: ServiceMonitor selects Service ${svc.metadata.name} only if it has a metrics port`);
    }
    // Drain: preStop sleep, then SIGTERM, then --drain_grace_s, then kvrmd's teardown (at most
    // 5 s for cancelled streams, 5 s for HTTP replies, 2 s of gRPC shutdown, 0.5 s for the
    // last statuses: 12.5 s), all inside the grace period.
    const grace = Number(value("drain_grace_s"));
    const pre = c.lifecycle && c.lifecycle.preStop;
    const sleep = pre && pre.exec && pre.exec.command[0] === "sleep" ? Number(pre.exec.command[1])
                : pre && pre.sleep ? Number(pre.sleep.seconds) : NaN;
    const tgps = pod.terminationGracePeriodSeconds;
    check(sleep > 0, `${overlay}: preStop sleeps ${sleep} s`);
    check(grace > 0 && sleep + grace + 12.5 <= tgps,
          `${overlay}: preStop ${sleep} s + --drain_grace_s ${grace} s + 12.5 s teardown <= ` +
          `terminationGracePeriodSeconds ${tgps}`);
    // Model volume mounted where --model points.
    const model = value("model");
    const mount = (c.volumeMounts || []).find((v) => model.startsWith(v.mountPath + "/"));
    const vol = mount && pod.volumes.find((v) => v.name === mount.name);
    check(vol && vol.persistentVolumeClaim, `${overlay}: --model=${model} is on a PVC volume`);
    // Every container has requests and limits for cpu and memory.
    check(c.resources && ["cpu", "memory"].every((r) => c.resources.requests?.[r] && c.resources.limits?.[r]),
          `${overlay}: cpu and memory requests and limits`);
    // The HPA's metric is one kvrmd exports.
    const hpa = objs.find((o) => o.kind === "HorizontalPodAutoscaler");
    for (const m of hpa.spec.metrics) {
      const name = m.pods && m.pods.metric.name;
      check(name && metricsDoc.includes("`" + name + "`"), `${overlay}: HPA metric ${name} is in docs/metrics.md`);
    }
    check(hpa.spec.scaleTargetRef.name === dep.metadata.name, `${overlay}: HPA targets the Deployment`);
    const gpus = Number((c.resources.limits || {})["nvidia.com/gpu"] || 0);
    if (gpus > 0) {
      check(value("device") === "cuda", `${overlay}: ${gpus} GPUs and --device=cuda`);
      check(Number(flags.tp || 1) === gpus, `${overlay}: --tp=${flags.tp} uses all ${gpus} GPUs`);
    } else {
      check(value("device") === "cpu", `${overlay}: no GPU and --device=${value("device")}`);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Dockerfiles.

// Instructions of a Dockerfile as [{stage, op, args}], continuation lines joined.
function parseDockerfile(text) {
  const out = [];
  let stage = -1;
  const lines = text.replace(/\\\n/g, " ").split("\n");
  for (const raw of lines) {
    const line = raw.trim();
    if (!line || line.startsWith("#")) continue;
    const m = /^(\w+)\s+(.*)$/.exec(line);
    if (!m) continue;
    const op = m[1].toUpperCase();
    if (op === "FROM") stage++;
    out.push({ stage, op, args: m[2].replace(/\s+/g, " ").trim() });
  }
  return out;
}

function checkDocker(root) {
  const readme = fs.readFileSync(path.join(root, "README.md"), "utf8");
  const testSh = fs.readFileSync(path.join(root, "tools/test.sh"), "utf8");
  const ciRun = fs.readFileSync(path.join(root, ".ci/run"), "utf8");
  // What CI runs: .ci/run -> tools/test.sh -> tools/setup.sh, then bazel; the README's build line.
  check(/^bash tools\/test\.sh/m.test(ciRun), ".ci/run runs tools/test.sh");
  check(/^bash tools\/setup\.sh/m.test(testSh), "tools/test.sh runs tools/setup.sh");
  const readmeBuild = (/^(bazel build \/\/server:kvrmd [^\n]*)$/m.exec(readme) || [])[1];
  check(readmeBuild, `README builds kvrmd with: ${readmeBuild}`);
  for (const [file, buildImage, runImage] of [
    ["deploy/docker/Dockerfile.cuda", /^nvidia\/cuda:[\w.-]*-devel-/, /^nvidia\/cuda:[\w.-]*-runtime-/],
    ["deploy/docker/Dockerfile.cpu", /^debian:12(\b|-)/, /^debian:12(\b|-)/],
  ]) {
    const ins = parseDockerfile(fs.readFileSync(path.join(root, file), "utf8"));
    const froms = ins.filter((i) => i.op === "FROM");
    check(froms.length === 2, `${file}: two stages`);
    if (froms.length !== 2) continue;
    check(buildImage.test(froms[0].args) && / AS build$/i.test(froms[0].args),
          `${file}: build stage FROM ${froms[0].args}`);
    check(runImage.test(froms[1].args), `${file}: runtime stage FROM ${froms[1].args}`);
    const runs = ins.filter((i) => i.op === "RUN" && i.stage === 0).map((i) => i.args);
    // The build steps are exactly CI's commands: one RUN each, nothing chained onto them.
    const setup = runs.filter((r) => /setup\.sh/.test(r));
    check(setup.length === 1 && setup[0] === "bash tools/setup.sh",
          `${file}: RUN bash tools/setup.sh, as tools/test.sh does (${setup})`);
    // Any RUN invoking bazel as a command (not bazel-bin paths).
    const bazel = runs.filter((r) => /(^|[;&|(]\s*)bazel\s/.test(r));
    check(bazel.length === 1 && bazel[0] === readmeBuild,
          `${file}: RUN ${readmeBuild}, as the README (${bazel})`);
    check(runs.indexOf(setup[0]) < runs.indexOf(bazel[0]), `${file}: setup before build`);
    const last = ins.filter((i) => i.stage === 1);
    const user = last.filter((i) => i.op === "USER").map((i) => i.args).pop();
    check(user && !/^(root|0)(:|$)/.test(user), `${file}: runs as non-root user ${user}`);
    const ep = last.filter((i) => i.op === "ENTRYPOINT").map((i) => i.args).pop();
    let epArgs = null;
    try {
      epArgs = JSON.parse(ep);
    } catch (e) {}
    check(Array.isArray(epArgs) && /\/kvrmd$/.test(epArgs[0]),
          `${file}: exec-form ENTRYPOINT runs kvrmd as PID 1 (${ep})`);
    const exposed = last.filter((i) => i.op === "EXPOSE").flatMap((i) => i.args.split(" "));
    check(exposed.includes("50051") && exposed.includes("9400") && exposed.includes("8000"),
          `${file}: EXPOSE ${exposed}`);
    const vols = last.filter((i) => i.op === "VOLUME").map((i) => i.args).join(" ");
    check(/\/models\b/.test(vols), `${file}: VOLUME /models`);
    check(last.some((i) => i.op === "COPY" && /--from=build/.test(i.args)),
          `${file}: runtime stage copies the binaries from the build stage`);
  }
}

const [mode, root, extra] = process.argv.slice(2);
if (mode === "manifests") checkManifests(root);
else if (mode === "drift") checkDrift(root, extra);
else if (mode === "docker") checkDocker(root);
else {
  console.error("usage: check.js manifests|drift|docker ROOT [KVRMD]");
  process.exit(2);
}
console.log(failures ? `${failures} check(s) failed` : "all checks passed");
process.exit(failures ? 1 : 0);
