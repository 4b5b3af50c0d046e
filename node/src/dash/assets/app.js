'use strict';
// mesh dashboard: renders a DashView (GET api/status, then SSE api/events) into four views.
(() => {
  const $ = (id) => document.getElementById(id);
  const body = document.body;
  const TOKEN = new URLSearchParams(location.search).get('token');
  const withTok = (u) => TOKEN ? u + (u.includes('?') ? '&' : '?') + 'token=' + encodeURIComponent(TOKEN) : u;
  const VIEWS = ['mesh', 'farms', 'stream', 'time'];
  const PALETTE = ['#4e79a7', '#f28e2b', '#76b7b2', '#59a14f', '#edc948', '#b07aa1', '#ff9da7', '#9c755f', '#17becf', '#8c8fd6'];
  const color = (i) => PALETTE[((i | 0) % PALETTE.length + PALETTE.length) % PALETTE.length];
  const GIB = 1073741824;
  const ESC = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
  const esc = (s) => String(s == null ? '' : s).replace(/[&<>"']/g, (c) => ESC[c]);
  const short = (id) => (id ? String(id).slice(-8) : '—');
  const fin = (v) => typeof v === 'number' && isFinite(v);
  const num = (v, d = 2) => (fin(v) ? String(Math.round(v * 10 ** d) / 10 ** d) : '—');
  const int = (v) => (fin(v) ? Math.round(v).toLocaleString('en-US') : '—');
  const gib = (b) => (fin(b) ? (b / GIB).toFixed(b >= 100 * GIB ? 0 : 1) : '—');
  const bytes = (b) => {
    if (!fin(b)) return '—';
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
    return (i ? b.toFixed(1) : String(b)) + ' ' + u[i];
  };
  const tip = $('tip');
  const clock = (ms) => new Date(ms).toLocaleTimeString('en-GB', { hour12: false });

  function dur(s) {
    if (!fin(s)) return '—';
    s = Math.max(0, Math.round(s));
    if (s < 60) return s + 's';
    const m = Math.floor(s / 60);
    if (m < 60) return m + 'm ' + (s % 60) + 's';
    const h = Math.floor(m / 60);
    if (h < 24) return h + 'h ' + (m % 60) + 'm';
    return Math.floor(h / 24) + 'd ' + (h % 24) + 'h';
  }

  function meter(used, total, label) {
    const f = fin(used) && fin(total) && total > 0 ? Math.min(1, Math.max(0, used / total)) : 0;
    const cls = f >= 0.9 ? ' hi' : f >= 0.7 ? ' mid' : '';
    return `<div class="meter${cls}"><i style="width:${(f * 100).toFixed(1)}%"></i><span>${esc(label)}</span></div>`;
  }

  const resLabel = (r) => r.kind === 'mem'
    ? `${gib(r.used)} / ${gib(r.total)} GiB`
    : `${num(r.used)} / ${num(r.total)}`;

  // ---------------------------------------------------------------- mesh
  // The Mesh view: the mesh at a glance, a heat map of every node (a digit
  // per node in the update), and a table the server pages, sorts and
  // filters (api/nodes): a thousand nodes cost the page what ten do.
  const STATES = { Running: 'running tasks', Queued: 'tasks queued', Idle: 'idle', Draining: 'draining', Joining: 'joining' };
  const MARK = { coord: 1, local: 2, behind: 4, drain: 8 };
  const tbl = { q: '', state: '', sort: 'id', desc: false, page: 0, per: 50 };
  let tblSeq = 0, tblBusy = false, tblAgain = false;

  function meshSkeleton() {
    const v = $('view-mesh');
    if ($('mesh-sum')) return;
    v.innerHTML = '<p class="summary" id="mesh-sum"></p><div class="heat" id="heat" role="img" aria-label="heat map of the nodes"></div>' +
      '<p class="legend" id="heat-legend"></p>' +
      '<div class="tools"><input id="n-q" type="search" placeholder="filter by node id" aria-label="filter by node id">' +
      '<select id="n-state" aria-label="state"><option value="">every state</option><option value="busy">busy</option>' +
      Object.entries(STATES).map(([k, w]) => `<option value="${k.toLowerCase()}">${esc(w)}</option>`).join('') + '</select>' +
      '<span id="n-pager"></span></div><div class="tablebox" id="n-table"></div><div id="mesh-lat"></div>';
    $('n-q').addEventListener('input', (e) => { tbl.q = e.target.value.trim(); tbl.page = 0; fetchNodes(); });
    $('n-state').addEventListener('change', (e) => { tbl.state = e.target.value; tbl.page = 0; fetchNodes(); });
    $('n-table').addEventListener('click', (e) => {
      const th = e.target.closest('th[data-sort]');
      if (!th) return;
      const k = th.dataset.sort;
      tbl.desc = tbl.sort === k ? !tbl.desc : k !== 'id';
      tbl.sort = k; tbl.page = 0; fetchNodes();
    });
    $('n-pager').addEventListener('click', (e) => {
      const b = e.target.closest('button[data-page]');
      if (b) { tbl.page = +b.dataset.page; fetchNodes(); }
    });
    const heat = $('heat');
    heat.addEventListener('mousemove', (e) => {
      const c = e.target.closest('i[data-i]');
      if (!c) { tip.hidden = true; return; }
      showCell(+c.dataset.i, e.clientX, e.clientY);
    });
    heat.addEventListener('mouseleave', () => { tip.hidden = true; });
    heat.addEventListener('click', (e) => {
      const c = e.target.closest('i[data-i]');
      if (!c) return;
      nodeAt(+c.dataset.i).then((n) => {
        if (!n) return;
        tbl.q = n.id; tbl.state = ''; tbl.page = 0;
        $('n-q').value = n.id; $('n-state').value = '';
        fetchNodes();
      });
    });
  }

  const cellCache = new Map();
  function nodeAt(i) {
    const hit = cellCache.get(i);
    if (hit && performance.now() - hit.t < 2000) return Promise.resolve(hit.n);
    return fetch(withTok('api/nodes?at=' + i), { cache: 'no-store' }).then((r) => r.json())
      .then((p) => { const n = (p.rows || [])[0]; cellCache.set(i, { t: performance.now(), n }); return n; })
      .catch(() => null);
  }

  function nodeText(n) {
    const cpu = (n.resources || []).find((r) => r.kind === 'cpu');
    return `${n.id}${n.coordinator ? ' · coordinator' : ''}${n.local ? ' · this node' : ''}\n` +
      `${STATES[n.state] || n.state || ''} · ${int(n.running)} running, ${int(n.queued)} queued` +
      (cpu ? `\ncpu ${num(cpu.used)} of ${num(cpu.total)} in use` : '') +
      (fin(n.load) ? `\nload ${num(n.load)}${fin(n.cpus) ? ' on ' + n.cpus + ' cores' : ''}` : '') +
      (fin(n.mem_used) && fin(n.mem_total) ? `\nmemory ${gib(n.mem_used)} of ${gib(n.mem_total)} GiB` : '') +
      (n.gpus ? `\n${n.gpus} GPU${n.gpus === 1 ? '' : 's'}` : '') +
      (n.health ? `\nbehind: local health ${n.health} of 8` : '') + (n.job ? `\nbatch job ${n.job}` : '');
  }

  function showCell(i, x, y) {
    nodeAt(i).then((n) => {
      if (!n) return;
      tip.textContent = nodeText(n);
      tip.hidden = false;
      tip.style.left = Math.min(x + 12, innerWidth - 260) + 'px';
      tip.style.top = (y + 14) + 'px';
    });
  }

  function renderHeat(h) {
    const levels = (h && h.levels) || '';
    const marks = new Map((h && h.marks) || []);
    let s = '';
    for (let i = 0; i < levels.length; i++) {
      const m = marks.get(i) || 0;
      const c = levels[i] === '-' ? 'hj' : 'h' + levels[i];
      s += `<i class="${c}${m & MARK.coord ? ' mc' : ''}${m & MARK.local ? ' ml' : ''}${m & MARK.behind ? ' mb' : ''}${m & MARK.drain ? ' md' : ''}" data-i="${i}"></i>`;
    }
    return s;
  }

  function renderMesh(d) {
    meshSkeleton();
    const g = d.glance || {};
    const total = g.nodes || 0;
    const states = (g.by_state || []).map(([st, c]) => `<b>${int(c)}</b> ${esc(STATES[st] || st)}`).join(' · ');
    const res = (g.resources || []).map((r) => `${esc(r.kind)} ${esc(resLabel(r))}`).join(' · ');
    const spread = g.tasks_spread || [0, 0, 0];
    $('mesh-sum').innerHTML = `<b>${int(total)}</b> node${total === 1 ? '' : 's'}${states ? ' · ' + states : ''}` +
      (g.behind ? ` · <b class="bad">${int(g.behind)}</b> behind` : '') + (res ? `<br>in use: ${res}` : '') +
      `<br>tasks per node (running and queued): least ${int(spread[0])}, median ${int(spread[1])}, most ${int(spread[2])}` +
      ((g.short_of_files || []).length ? `<br><span class="bad">${int(g.short_of_files.length)} node(s) with an open-file limit too low for this mesh</span>` : '');
    $('heat').innerHTML = renderHeat(d.heat);
    $('heat-legend').innerHTML = '<span><i class="sw h0"></i>idle</span><span><i class="sw h5"></i>half its cores in use</span>' +
      '<span><i class="sw h9"></i>all</span><span><i class="sw hj"></i>joining</span><span><i class="sw h0 mc"></i>coordinator</span>' +
      '<span><i class="sw h0 ml"></i>this node</span><span><i class="sw h0 mb"></i>behind</span><span class="muted">hover a cell for its node, click to find it below</span>';
    let h = '<h3>latency</h3><div class="tablebox"><table class="latency"><thead><tr><th>measure</th><th class="num">count</th>' +
      '<th class="num">p50 ms</th><th class="num">p90 ms</th><th class="num">p99 ms</th><th class="num">max ms</th></tr></thead><tbody>';
    for (const l of d.latency || []) {
      h += `<tr><td>${esc(l.name)}</td><td class="num">${int(l.count)}</td><td class="num">${num(l.p50_ms)}</td>` +
        `<td class="num">${num(l.p90_ms)}</td><td class="num">${num(l.p99_ms)}</td><td class="num">${num(l.max_ms)}</td></tr>`;
    }
    if (!(d.latency || []).length) h += '<tr><td colspan="6" class="muted">no measurements yet</td></tr>';
    $('mesh-lat').innerHTML = h + '</tbody></table></div>';
    if (body.dataset.view === 'mesh') fetchNodes();
  }

  // One table request at a time; a change meanwhile asks again once it is back.
  function fetchNodes() {
    if (tblBusy) { tblAgain = true; return; }
    tblBusy = true;
    const seq = ++tblSeq;
    const p = new URLSearchParams({ sort: tbl.sort, page: tbl.page, per: tbl.per });
    if (tbl.desc) p.set('desc', 'true');
    if (tbl.q) p.set('q', tbl.q);
    if (tbl.state) p.set('state', tbl.state);
    fetch(withTok('api/nodes?' + p), { cache: 'no-store' }).then((r) => r.json())
      .then((page) => { if (seq === tblSeq) renderTable(page); })
      .catch(() => {})
      .finally(() => { tblBusy = false; if (tblAgain) { tblAgain = false; fetchNodes(); } });
  }

  function renderTable(p) {
    tbl.page = p.page || 0;
    const rows = p.rows || [];
    const arrow = (k) => (tbl.sort === k ? (tbl.desc ? ' ▾' : ' ▴') : '');
    const th = (k, label, cls) => `<th data-sort="${k}"${cls ? ` class="${cls}"` : ''} title="sort">${label}${arrow(k)}</th>`;
    let h = '<table class="nodes"><thead><tr>' + th('id', 'node') + th('state', 'state') + th('use', 'cpu in use') +
      th('load', 'load') + th('memory', 'memory') + th('queued', 'queued', 'num') + th('running', 'running', 'num') + '<th class="num">gpus</th></tr></thead><tbody>';
    for (const n of rows) {
      const cpu = (n.resources || []).find((r) => r.kind === 'cpu');
      h += `<tr class="node${n.local ? ' local' : ''}${n.coordinator ? ' coord' : ''}" data-id="${esc(n.id)}">` +
        `<td title="${esc(n.id)}"><code>${esc(short(n.id))}</code>` +
        (n.coordinator ? '<span class="tag c">coordinator</span>' : '') + (n.local ? '<span class="tag l">local</span>' : '') +
        (n.health ? `<span class="tag b" title="local health ${n.health} of 8">behind</span>` : '') + '</td>' +
        `<td>${esc(STATES[n.state] || n.state || '')}</td>` +
        '<td>' + (cpu ? meter(cpu.used, cpu.total, resLabel(cpu)) : '') + '</td>' +
        '<td>' + (fin(n.load) ? meter(n.load, n.cpus || 0, fin(n.cpus) ? `${num(n.load)} / ${n.cpus} cpus` : num(n.load)) : '—') + '</td>' +
        '<td>' + (fin(n.mem_used) && fin(n.mem_total) ? meter(n.mem_used, n.mem_total, `${gib(n.mem_used)} / ${gib(n.mem_total)} GiB`) : '—') + '</td>' +
        `<td class="num">${int(n.queued)}</td><td class="num">${int(n.running)}</td><td class="num">${n.gpus ? int(n.gpus) : ''}</td></tr>`;
    }
    if (!rows.length) h += `<tr><td colspan="8" class="muted">${p.total ? 'no node matches' : 'no nodes'}</td></tr>`;
    $('n-table').innerHTML = h + '</tbody></table>';
    const pages = Math.max(1, Math.ceil((p.matched || 0) / (p.per || 1)));
    $('n-pager').innerHTML = `<span class="muted">${int(p.matched)} of ${int(p.total)} node${p.total === 1 ? '' : 's'}</span>` +
      (pages > 1 ? ` <button data-page="${Math.max(0, tbl.page - 1)}"${tbl.page === 0 ? ' disabled' : ''}>‹</button>` +
        ` <span>page ${tbl.page + 1} of ${pages}</span>` +
        ` <button data-page="${Math.min(pages - 1, tbl.page + 1)}"${tbl.page >= pages - 1 ? ' disabled' : ''}>›</button>` : '');
  }

  // ---------------------------------------------------------------- farms
  // What a stage's finished tasks used (mesh status FARM's `used` line).
  function usedCells(u) {
    if (!u) return '<td class="num">—</td><td class="num">—</td><td class="num">—</td>';
    const ask = u.mem_asked ? ` of ${bytes(u.mem_asked)}` : '';
    const oom = u.oom ? ` <span class="oom" title="killed for want of memory">${int(u.oom)} OOM</span>` : '';
    return `<td class="num" data-runtime-p50-ms="${u.runtime_p50_ms}">${u.runtime_p50_ms < 10000 ? num(u.runtime_p50_ms / 1000, 2) + 's' : dur(u.runtime_p50_ms / 1000)}</td>` +
      `<td class="num">${num(u.cpu_pct, 0)}%</td>` +
      `<td class="num" data-peak-max="${u.peak_max}"${u.peak_max ? '' : ' title="its tasks ended before the first look (10 ms in)"'}>` +
      `${u.peak_max ? bytes(u.peak_p50) + ' / ' + bytes(u.peak_max) : 'not seen'}${ask}${oom}</td>`;
  }

  function renderFarms(d) {
    const farms = d.farms || [];
    if (!farms.length) return '<p class="muted">no farms</p>';
    let h = '';
    for (const f of farms) {
      h += `<div class="card farm" data-farm="${esc(f.id)}"><div class="farm-head"><h2>${esc(f.name)}</h2>` +
        `<code>${esc(f.id)}</code><span class="muted">home <code title="${esc(f.home)}">${esc(short(f.home))}</code></span>` +
        (f.finished ? '<span class="state fin">finished</span>' : '<span class="state run">running</span>') +
        (f.eta ? `<span class="eta">${esc(f.eta)}</span>` : '') +
        (f.data ? `<span class="muted data">${esc(f.data)}</span>` : '') + '</div>';
      h += '<div class="tablebox"><table class="stages"><thead><tr><th>stage</th><th>progress</th><th class="num">done</th><th class="num">running</th>' +
        '<th class="num">queued</th><th class="num">failed</th><th class="num">rate</th><th class="num">ETA</th>' +
        '<th class="num" title="median runtime of its finished tasks">runtime</th><th class="num" title="CPU time over runtime, in % of one core">CPU</th>' +
        '<th class="num" title="peak resident memory: median / largest, of the memory asked">peak memory</th></tr></thead><tbody>';
      for (const s of f.stages || []) {
        const t = s.total || 0;
        const other = (s.skipped || 0) + (s.cancelled || 0);
        const pc = (v) => (t > 0 ? Math.max(0, (v || 0) * 100 / t).toFixed(2) : 0) + '%';
        const pct = t > 0 ? Math.floor((s.done || 0) * 100 / t) : 0;
        h += `<tr class="stage" data-farm="${esc(f.id)}" data-stage="${esc(s.name)}" data-done="${s.done || 0}" data-total="${t}">` +
          `<td>${esc(s.name)}</td><td class="bar"><div class="stack" title="${pct}% done">` +
          `<i class="d" style="width:${pc(s.done)}"></i><i class="f" style="width:${pc(s.failed)}"></i>` +
          `<i class="o" style="width:${pc(other)}"></i><i class="r" style="width:${pc(s.running)}"></i>` +
          `<i class="q" style="width:${pc(s.queued)}"></i></div></td>` +
          `<td class="num">${int(s.done)}/${int(t)}</td><td class="num">${int(s.running)}</td><td class="num">${int(s.queued)}</td>` +
          `<td class="num">${int(s.failed)}${other ? ` <span class="muted" title="skipped ${s.skipped || 0}, cancelled ${s.cancelled || 0}">+${other}</span>` : ''}</td>` +
          `<td class="num">${fin(s.rate) ? num(s.rate, 1) + '/s' : '—'}</td><td class="num">${dur(s.eta_s)}</td>` +
          usedCells(s.used) + '</tr>';
      }
      h += '</tbody></table></div>';
      for (const hint of f.hints || []) h += `<p class="hint">${esc(hint)}</p>`;
      h += runningTable(d, f);
      const fl = f.failures || [];
      if (fl.length) {
        h += `<h3>failures (${fl.length})</h3><ul class="failures">`;
        for (const x of fl) {
          h += '<li>' + (x.logs
            ? `<a href="${esc(withTok(x.logs))}" target="_blank" rel="noopener">${esc(x.text)}</a>`
            : esc(x.text)) + '</li>';
        }
        h += '</ul>';
      }
      h += '</div>';
    }
    return h;
  }

  // What the farm's running tasks hold now, the heaviest first (their
  // nodes' last looks; a thin task ends before one).
  const RUNNING_SHOWN = 8;
  function runningTable(d, f) {
    const rows = (d.running || []).filter((r) => r.farm === f.id);
    if (!rows.length) return '';
    let h = `<h3>running now (${rows.length}${rows.length >= RUNNING_SHOWN ? ', heaviest shown' : ''})</h3>` +
      '<div class="tablebox"><table class="running"><thead><tr><th>task</th><th>on</th><th class="num">for</th>' +
      '<th class="num" title="share of one core since the last look">CPU</th>' +
      '<th class="num" title="resident memory of its processes now / the most seen, of the memory asked">memory</th></tr></thead><tbody>';
    for (const r of rows.slice(0, RUNNING_SHOWN)) {
      const ask = r.mem_asked ? ` of ${bytes(r.mem_asked)}` : '';
      h += `<tr class="run-task" data-node="${esc(r.node)}" data-slot="${r.slot}" data-peak="${r.peak}">` +
        `<td>${esc(r.stage)} #${int(r.task)}${r.attempt > 1 ? ` (attempt ${int(r.attempt)})` : ''}</td>` +
        `<td><code title="${esc(r.node)}">${esc(short(r.node))}</code>/${int(r.slot)}</td>` +
        `<td class="num">${dur(((d.at || 0) - r.start) / 1000)}</td>` +
        `<td class="num">${r.cpu_pct == null ? '—' : num(r.cpu_pct, 0) + '%'}</td>` +
        `<td class="num">${bytes(r.rss)} / ${bytes(r.peak)}${ask}</td></tr>`;
    }
    return h + '</tbody></table></div>';
  }

  // ---------------------------------------------------------------- stream
  function niceStep(spanS, want) {
    const steps = [1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1800, 3600];
    for (const s of steps) if (spanS / s <= want) return s;
    return Math.ceil(spanS / want / 3600) * 3600;
  }

  let streamBars = [], streamLanes = [], streamStages = [];

  function renderStream(d, W) {
    const s = d.stream || {};
    const lanes = s.lanes || [], bars = s.bars || [], stages = s.stages || [];
    streamBars = bars; streamLanes = lanes; streamStages = stages;
    const span = Math.max(1, (s.t1 || 0) - (s.t0 || 0));
    const LW = 118, RP = 14, TOP = 20;
    const rowH = lanes.length > 60 ? 12 : 18;
    const PW = Math.max(100, W - LW - RP);
    const H = TOP + lanes.length * rowH + 6;
    const k = PW / span;
    let running = 0, failed = 0;
    const p = [`<svg id="stream-svg" xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}">`];
    let prev = null, alt = true;
    for (let i = 0; i < lanes.length; i++) {
      const l = lanes[i], y = TOP + i * rowH;
      if (l.node !== prev) { alt = !alt; prev = l.node; }
      if (alt) p.push(`<rect class="band" x="0" y="${y}" width="${W}" height="${rowH}"/>`);
      p.push(`<text class="lane" x="${LW - 8}" y="${y + rowH / 2}">${esc(short(l.node))}/${esc(l.slot)}</text>`);
    }
    const spanS = span / 1000, step = niceStep(spanS, 6);
    for (let v = 0; v <= spanS + 1e-9; v += step) {
      const x = (LW + PW - v * 1000 * k).toFixed(1);
      p.push(`<line class="grid" x1="${x}" x2="${x}" y1="${TOP - 4}" y2="${H}"/>`);
      p.push(`<text class="tick" x="${x}" y="12"${v === 0 ? ' text-anchor="end"' : ''}>${v === 0 ? 'now' : (v < 120 ? v + 's' : dur(v)) + ' ago'}</text>`);
    }
    const bh = rowH - 4;
    for (let i = 0; i < bars.length; i++) {
      const b = bars[i], lane = b[0];
      if (!(lane >= 0 && lane < lanes.length)) continue;
      const run = b[2] == null;
      const a = Math.max(0, b[1] || 0), e = Math.min(span, run ? span : b[2]);
      if (e < 0 || a > span) continue;
      if (run) running++;
      if (b[4]) failed++;
      const x = LW + a * k, w = Math.max(1.5, (Math.max(e, a) - a) * k - 1);
      p.push(`<rect class="bar${b[4] ? ' failed' : ''}" data-lane="${lane}" data-i="${i}"${run ? ' data-run="1"' : ''} x="${x.toFixed(1)}" y="${TOP + lane * rowH + 2}" width="${w.toFixed(1)}" height="${bh}" fill="${color(b[3])}"/>`);
    }
    p.push('</svg>');
    let lg = '<div class="legend">';
    stages.forEach((n, i) => { lg += `<span><i class="sw" style="background:${color(i)}"></i>${esc(n)}</span>`; });
    lg += '<span><i class="sw fl"></i>failed</span>' +
      `<span>· ${int(bars.length)} tasks in the last ${dur(spanS)}, ${int(running)} running, ${int(failed)} failed</span></div>`;
    return lg + (lanes.length ? `<div class="scroll">${p.join('')}</div>` : '<p class="muted">no lanes</p>');
  }

  function tipText(i) {
    const b = streamBars[i];
    if (!b) return '';
    const l = streamLanes[b[0]] || {};
    const end = b[2] == null ? null : b[2];
    // A running bar's figures, where its node told them.
    const r = end == null && last ? (last.running || []).find((x) => x.node === l.node && x.slot === l.slot) : null;
    return `${streamStages[b[3]] || 'stage ' + b[3]}${b[4] ? '  FAILED' : ''}\n` +
      `${short(l.node)}/${l.slot}\n` +
      (end == null ? `running for ${dur(((streamSpan()) - b[1]) / 1000)}` : `took ${num((end - b[1]) / 1000, 2)}s`) +
      (r ? `\nholds ${bytes(r.rss)} (most ${bytes(r.peak)})${r.cpu_pct == null ? '' : `, CPU ${num(r.cpu_pct, 0)}%`}` : '');
  }
  const streamSpan = () => (last && last.stream ? last.stream.t1 - last.stream.t0 : 0);

  // ---------------------------------------------------------------- time
  function chart(title, t, v, W, opt) {
    const H = 120, L = 40, R = 8, T = 6, B = 18;
    const n = Math.min(t.length, v.length);
    let max = 0, sum = 0;
    for (let i = 0; i < n; i++) { const x = v[i] || 0; if (x > max) max = x; sum += x; }
    const ymax = niceMax(max);
    const x0 = n ? t[0] : 0, x1 = n ? t[n - 1] : 1, xs = Math.max(1, x1 - x0);
    const pw = W - L - R, ph = H - T - B;
    const X = (tt) => (L + (tt - x0) * pw / xs).toFixed(1);
    const Y = (y) => (T + ph - (y || 0) * ph / ymax).toFixed(1);
    let line = '';
    for (let i = 0; i < n; i++) line += (i ? 'L' : 'M') + X(t[i]) + ' ' + Y(v[i]);
    const c = opt.color;
    let s = `<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}">`;
    for (const g of [0, 0.5, 1]) {
      const y = Y(ymax * g);
      s += `<line class="grid" x1="${L}" x2="${W - R}" y1="${y}" y2="${y}"/><text x="${L - 5}" y="${y}" text-anchor="end" dominant-baseline="central">${num(ymax * g, 1)}</text>`;
    }
    if (n > 1) {
      s += `<path class="area" fill="${c}" d="${line}L${X(t[n - 1])} ${Y(0)}L${X(t[0])} ${Y(0)}Z"/>`;
      s += `<path class="line" stroke="${c}" d="${line}"/>`;
      s += `<text x="${L}" y="${H - 4}">${clock(x0)}</text><text x="${W - R}" y="${H - 4}" text-anchor="end">${clock(x1)}</text>`;
    }
    s += '</svg>';
    const lastV = n ? v[n - 1] : null;
    const extra = opt.total ? ` · total ${int(sum * (opt.scale || 1))}` : '';
    return `<div class="chart-box"><div class="chart-head"><b>${esc(title)}</b><span>now ${num(lastV, 1)}${opt.unit || ''} · max ${num(max, 1)}${extra}</span></div>${s}</div>`;
  }

  function niceMax(m) {
    if (!(m > 0)) return 1;
    const e = 10 ** Math.floor(Math.log10(m));
    for (const f of [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10]) if (f * e >= m) return f * e;
    return 10 * e;
  }

  function renderTime(d, W) {
    const s = d.series || {};
    const t = s.t || [];
    // done per interval -> per second, using each point's interval length
    const rate = t.map((tt, i) => {
      const dt = i > 0 ? tt - t[i - 1] : (t.length > 1 ? t[1] - t[0] : 1000);
      return (s.done && s.done[i] || 0) * 1000 / Math.max(1, dt);
    });
    // Drawn at the width a chart gets in the grid's columns (two from
    // 900 px); the grid's columns and the SVG's own scaling keep it in
    // its box whatever the window.
    const cw = W >= 900 ? Math.floor((W - 14) / 2) - 18 : W - 18;
    let h = '<div class="charts">' +
      chart('throughput (tasks done /s)', t, rate, cw, { color: '#3a9d5d', unit: '/s' }) +
      chart('failures', t, s.failed || [], cw, { color: '#d64545', total: true }) +
      chart('steals', t, s.steals || [], cw, { color: '#b07aa1', total: true }) +
      chart('nodes', t, s.nodes || [], cw, { color: '#3b7dd8' }) + '</div>';
    h += '<h3>events</h3><ol class="events">';
    const ev = d.events || [];
    for (let i = ev.length - 1; i >= 0; i--) h += `<li><time>${clock(ev[i].at)}</time>${esc(ev[i].text)}</li>`;
    if (!ev.length) h += '<li class="muted">no events</li>';
    return h + '</ol>';
  }

  // ---------------------------------------------------------------- glue
  let last = null, updates = 0;

  function contentWidth() {
    const m = $('main');
    // No floor wider than a phone: a wider drawing would widen the page.
    return Math.max(240, (m ? m.clientWidth : 1200) - 32 - 2);
  }

  function put(id, f, d, w) {
    let h;
    try { h = f(d, w); } catch (e) { h = `<p class="err">render failed: ${esc(e && e.message)}</p>`; }
    $(id).innerHTML = h;
  }

  function renderWide(d) {
    const w = contentWidth();
    put('view-stream', renderStream, d, w);
    put('view-time', renderTime, d, w);
  }

  function render(d) {
    const t0 = performance.now();
    last = d;
    $('h-local').textContent = short(d.local);
    $('h-local').title = d.local || '';
    $('h-coord').innerHTML = d.coordinator
      ? `coordinator <code title="${esc(d.coordinator)}">${esc(short(d.coordinator))}</code> · term ${esc(d.term)}`
      : `no coordinator · term ${esc(d.term)}`;
    $('h-at').textContent = fin(d.at) ? 'updated ' + clock(d.at) : '';
    document.title = 'mesh · ' + short(d.local);
    // Updated in place: the table's filter keeps its focus and text.
    try { renderMesh(d); } catch (e) { $('view-mesh').innerHTML = `<p class="err">render failed: ${esc(e && e.message)}</p>`; }
    put('view-farms', renderFarms, d);
    renderWide(d);
    updates++;
    body.dataset.updates = String(updates);
    // What the page's own work costs, apart from what the machine makes it wait.
    body.dataset.renderMs = String(Math.ceil(performance.now() - t0));
    body.dataset.heatCells = String(document.querySelectorAll('#heat i').length);
    if (updates === 1) body.dataset.firstRenderMs = String(Math.round(performance.now()));
  }

  function accept(d) {
    if (!d || typeof d !== 'object') return;
    if (last && fin(last.at) && fin(d.at) && d.at < last.at) return; // stale (late initial fetch)
    render(d);
  }

  function badge(state) {
    const b = $('badge');
    b.className = 'badge ' + state;
    b.textContent = state === 'live' ? 'live' : state === 'off' ? 'disconnected, retrying' : 'connecting';
  }

  function route() {
    let v = location.hash.slice(1);
    if (!VIEWS.includes(v)) v = 'mesh';
    body.dataset.view = v;
    for (const a of document.querySelectorAll('#tabs a')) a.classList.toggle('on', a.dataset.v === v);
    if (v === 'mesh' && last) fetchNodes();
  }

  let es = null;
  function connect() {
    if (typeof EventSource === 'undefined') return;
    es = new EventSource(withTok('api/events'));
    es.onopen = () => badge('live');
    es.onmessage = (m) => {
      let d;
      try { d = JSON.parse(m.data); } catch (e) { return; }
      badge('live');
      accept(d);
    };
    es.onerror = () => {
      badge('off');
      // The browser retries by itself unless the stream was refused outright (CLOSED).
      if (es.readyState === 2) { es = null; setTimeout(connect, 3000); }
    };
  }

  // A page test renders a view it made (a thousand nodes) through this.
  window.meshDash = { show: accept };

  route();
  window.addEventListener('hashchange', route);
  fetch(withTok('api/status'), { cache: 'no-store' })
    .then((r) => (r.ok ? r.json() : Promise.reject(new Error('HTTP ' + r.status))))
    .then(accept)
    .catch(() => { if (!last) $('view-mesh').innerHTML = '<p class="muted">waiting for data…</p>'; });
  connect();

  let rt = 0;
  window.addEventListener('resize', () => {
    clearTimeout(rt);
    rt = setTimeout(() => { if (last) renderWide(last); }, 150);
  });

  // Gantt tooltip, one listener for all bars.
  $('view-stream').addEventListener('mousemove', (ev) => {
    const r = ev.target;
    if (r && r.classList && r.classList.contains('bar')) {
      tip.textContent = tipText(+r.getAttribute('data-i'));
      tip.hidden = false;
      tip.style.left = Math.min(ev.clientX + 12, innerWidth - 200) + 'px';
      tip.style.top = (ev.clientY + 14) + 'px';
    } else tip.hidden = true;
  });
  $('view-stream').addEventListener('mouseleave', () => { tip.hidden = true; });
})();
