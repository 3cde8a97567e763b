"""The page around the tabs: its style sheet and its one script (clicks on figures, export buttons, toasts), which
app.py hands to Gradio's launch."""

from __future__ import annotations

CSS = """
.intro {font-size: 1.02rem; line-height: 1.5;}
.notice {border-left: 4px solid #e0a800; padding: 0.4rem 0.8rem; background: #fff8e1;}
.highlight {font-size: 1.15rem; line-height: 2.0;}
footer {display: none !important;}
.atlas-hidden {display: none !important;}  /* the boxes a figure click writes into (JS below) */
.block:has(> .js-plotly-plot) {overflow-x: auto !important;}  /* a figure wider than its column scrolls, not clipped */
/* and shows that it does: a styled scrollbar is drawn always (an overlay one hid the colour bar and later panels) */
.block:has(> .js-plotly-plot)::-webkit-scrollbar {height: 12px;}
.block:has(> .js-plotly-plot)::-webkit-scrollbar-thumb {background: #b8b8c8; border-radius: 6px;}
.block:has(> .js-plotly-plot)::-webkit-scrollbar-track {background: #eeeef4;}
/* A failed request says so once, in its toast: no "Error" badge over each of its outputs (Gradio's status tracker). */
[data-testid="status-tracker"]:has(> .error) {display: none !important;}
/* A phone: a row's figures (tabs.common.Plot) take the whole width, one under another, not a 160 px column each. */
@media (max-width: 600px) {
  .row > .atlas-plot, .row > .column:has(.atlas-plot) {min-width: 100% !important;}
}
.atlas-export {display: flex; gap: 0.3rem; justify-content: flex-end; padding: 0.15rem 0.3rem;}  /* under each figure */
.atlas-export button {font-size: 0.75rem; padding: 0 0.5rem; border: 1px solid var(--border-color-primary);
  border-radius: 4px; background: var(--background-fill-secondary); cursor: pointer;}
"""
# A click on a thumbnail of the model view (its trace's meta.thumbnails: cells a side and the gap) writes
# "layer,head,click number" into "<tab>-open-head", whose handler shows that head as a heatmap (tabs/sections/why.py).
# A click on a heatmap cell of an attention figure (elem_id "<tab>-attention") or a patching sweep ("<tab>-patch")
# writes "row,col,click number" into the hidden box "<tab>-why-cell" / "<tab>-patch-cell" (a point of a Q/K scatter,
# "<tab>-qk": "position,click number" into "<tab>-qk-cell"), whose change event runs the
# handler (a script's input event is not a user's, so Gradio's .input does not fire; the click number makes a second
# click on the same cell a change too). A click on a cell of the Heads tab's grid ("heads-grid") or a bar of its
# finder ("heads-finder") writes "layer,head,click number" into "heads-open" (tabs/heads.py: that head's card).
JS = """() => {
  const bind = () => {
    // the Heads tab's grid (a cell: layer, head) and finder (a bar: its customdata) open that head's card
    document.querySelectorAll('#heads-grid, #heads-finder').forEach((box) => {
      const plot = box.querySelector('.js-plotly-plot');
      if (!plot || plot._atlasBound || !plot.on) return;
      plot._atlasBound = true;
      plot.on('plotly_click', (ev) => {
        const p = ev.points && ev.points[0];
        if (!p) return;
        const at = p.data.type === 'heatmap' && Array.isArray(p.pointNumber) ? p.pointNumber
                   : Array.isArray(p.customdata) ? p.customdata : null;
        const input = document.querySelector('#heads-open textarea, #heads-open input');
        if (!at || !input) return;
        window._atlasClicks = (window._atlasClicks || 0) + 1;
        input.value = at[0] + ',' + at[1] + ',' + window._atlasClicks;
        input.dispatchEvent(new Event('input', {bubbles: true}));
      });
    });
    document.querySelectorAll('[id$="-attention"], [id$="-patch"], [id$="-qk"]').forEach((box) => {
      const plot = box.querySelector('.js-plotly-plot');
      if (!plot || plot._atlasBound || !plot.on) return;
      plot._atlasBound = true;
      plot.on('plotly_click', (ev) => {
        const p = ev.points && ev.points[0];
        const thumbs = p && box.id.endsWith('-attention') && ((p.data.meta || {}).thumbnails);
        if (thumbs && Array.isArray(p.pointNumber)) {  // the model view: a thumbnail opens its layer and head
          const [q, k, gap] = thumbs;
          const [r, c] = p.pointNumber;
          if (r % (q + gap) >= q || c % (k + gap) >= k) return;  // a gap between thumbnails
          const open = document.querySelector('#' + box.id.replace(/-attention$/, '-open-head') + ' textarea, #'
                                              + box.id.replace(/-attention$/, '-open-head') + ' input');
          if (!open) return;
          window._atlasClicks = (window._atlasClicks || 0) + 1;
          open.value = Math.floor(r / (q + gap)) + ',' + Math.floor(c / (k + gap)) + ',' + window._atlasClicks;
          open.dispatchEvent(new Event('input', {bubbles: true}));
          return;
        }
        const qk = box.id.endsWith('-qk');  // a Q/K scatter (tabs/sections/qk.py): customdata is the token position
        if (!p || (qk ? typeof p.customdata !== 'number'
                   : p.data.type !== 'heatmap' || !Array.isArray(p.pointNumber))) return;
        const target = qk ? box.id + '-cell'
                          : box.id.replace(/-attention$/, '-why-cell').replace(/-patch$/, '-patch-cell');
        const input = document.querySelector('#' + target + ' textarea, #' + target + ' input');
        if (!input) return;
        window._atlasClicks = (window._atlasClicks || 0) + 1;
        const m = p.data.meta || {};  // a pooled heatmap's cells name their blocks' first tokens (viz.attention)
        const row = m.rows ? m.rows[p.pointNumber[0]] : p.pointNumber[0];
        const col = m.cols ? m.cols[p.pointNumber[1]] : p.pointNumber[1];
        input.value = (qk ? p.customdata : row + ',' + col) + ',' + window._atlasClicks;
        input.dispatchEvent(new Event('input', {bubbles: true}));
      });
    });
  };
  // Every drawn figure gets "SVG" and "PNG" buttons under it: Plotly's own export of that figure (window.Plotly is
  // the library Gradio's plot draws with), named after the figure's title.
  const exportBar = (plot) => {
    const box = plot.parentElement;
    if (!box || !plot._fullLayout || box.querySelector(':scope > .atlas-export')) return;
    const bar = document.createElement('div');
    bar.className = 'atlas-export';
    for (const format of ['svg', 'png']) {
      const button = document.createElement('button');
      button.type = 'button';
      button.textContent = format.toUpperCase();
      button.title = 'Download this figure as ' + format.toUpperCase();
      button.addEventListener('click', () => {
        const el = box.querySelector('.js-plotly-plot');
        const title = ((el._fullLayout.title || {}).text || '').replace(/<[^>]*>/g, ' ');
        const name = title.toLowerCase().replace(/[^a-z0-9]+/g, '-').replace(/^-+|-+$/g, '').slice(0, 60);
        window.Plotly.downloadImage(el, {format, filename: name || 'figure', scale: format === 'png' ? 2 : 1});
      });
      bar.append(button);
    }
    box.append(bar);
  };
  // A figure with a phone layout (viz.common.phone: layout.meta.atlas_phone) in a box narrower than its threshold
  // is drawn in its phone layout at the box's width: Gradio's own draw (Plotly.react, wrapped below) gets the phone
  // figure in place of the wide one, so the wide one is never drawn at a phone's width (Plotly failed on it, "axis
  // scaling", where vertical colour bars left no room); a figure drawn while its box was hidden or wide is drawn
  // again when its box's width changes, and a box that grows past the threshold (a phone turned sideways) gets the
  // figure as it was sent back.
  const drawn = new WeakSet();  // the phone layouts this script drew (a figure Gradio draws again is not one)
  // a trace's patch replaces whole attributes, except an object (a marker) it is merged into
  const merge = (t, patch) => {
    const out = Object.assign({}, t);
    for (const [k, v] of Object.entries(patch)) {
      const both = v && t[k] && typeof v === 'object' && typeof t[k] === 'object' && !Array.isArray(v);
      out[k] = both ? Object.assign({}, t[k], v) : v;
    }
    return out;
  };
  // the phone figure of a wide one at `width` px, the template, meta and images (left out of the phone layout) kept
  const phoneFigure = (plot, spec, wide, width) => {
    const layout = Object.assign({}, spec.layout, {width, autosize: false, template: wide.layout.template,
                                                   meta: wide.layout.meta, images: wide.layout.images});
    // the block's label floats over the figure's top (on a phone it can take two lines): the title goes under it
    const label = plot.parentElement && plot.parentElement.querySelector(':scope > label[data-testid="block-label"]');
    const over = label && label.offsetHeight && ((spec.layout.title || {}).text)
      ? Math.max(0, Math.round(label.getBoundingClientRect().bottom - plot.getBoundingClientRect().top) + 18) : 0;
    if (over) {
      const margin = spec.layout.margin || {};
      layout.margin = Object.assign({}, margin, {t: (margin.t || 0) + over});
      layout.height = (spec.layout.height || 450) + over;
      layout.title = Object.assign({}, spec.layout.title, {yref: 'container', yanchor: 'top',
                                                           y: 1 - over / layout.height});
    }
    const data = wide.data.map((t, i) => spec.traces[i] ? merge(t, spec.traces[i]) : t);
    drawn.add(layout);
    plot._atlasWide = wide;
    plot._atlasPhoneWidth = width;
    window._atlasPhoned = (window._atlasPhoned || 0) + 1;  // how many times (tests: once per figure and width)
    return [data, layout];
  };
  const phone = (plot) => {
    const spec = plot.layout && plot.layout.meta && plot.layout.meta.atlas_phone;
    const box = plot.parentElement;
    if (!spec || !plot._fullLayout || !window.Plotly || !box || box.clientWidth === 0) return;
    const narrow = box.clientWidth < spec.narrow, mine = drawn.has(plot.layout);
    if (mine && !narrow) {  // wide again: the figure as sent
      window.Plotly.newPlot(plot, plot._atlasWide.data, plot._atlasWide.layout, plot._context);
    } else if (narrow && !(mine && Math.abs(plot._atlasPhoneWidth - box.clientWidth) < 4)) {
      const [data, layout] = phoneFigure(plot, spec, mine ? plot._atlasWide : {data: plot.data, layout: plot.layout},
                                         box.clientWidth);
      window.Plotly.newPlot(plot, data, layout, plot._context);  // anew: a redraw from the wide layout can fail
    } else return;
    plot._atlasBound = false;  // newPlot dropped the figure's click handlers: bind them again
    bind();
  };
  const wrap = (P) => {
    if (!P || !P.react || P._atlasPhone) return;
    const react = P.react;
    P.react = function (gd, data, layout, config) {
      const spec = layout && layout.meta && layout.meta.atlas_phone, box = gd && gd.parentElement;
      if (spec && !drawn.has(layout) && box && box.clientWidth > 0 && box.clientWidth < spec.narrow) {
        [data, layout] = phoneFigure(gd, spec, {data, layout}, box.clientWidth);
        gd._atlasBound = false;
      }
      return react.call(this, gd, data, layout, config);
    };
    P._atlasPhone = true;
  };
  // Gradio loads Plotly with the first figure and sets window.Plotly before drawing it: wrapped as it is set
  let plotly = window.Plotly;
  wrap(plotly);
  Object.defineProperty(window, 'Plotly', {configurable: true, get: () => plotly,
                                           set: (value) => { plotly = value; wrap(value); }});
  let resized = null;
  window.addEventListener('resize', () => {
    clearTimeout(resized);
    resized = setTimeout(() => document.querySelectorAll('.js-plotly-plot').forEach(phone), 250);
  });
  // A new attempt (any button pressed outside a toast) closes the toasts of earlier ones, so errors neither stack
  // ("Error (2)") nor stay after the request that follows them has worked.
  document.addEventListener('click', (ev) => {
    if (!ev.target.closest('button') || ev.target.closest('.toast-body')) return;
    document.querySelectorAll('.toast-close').forEach((close) => close.click());
  }, true);
  // Plotly points its gradients (colour bars) and clip paths at url("<the page's address>#id"). The address changes
  // with every view (the permalink, tabs/permalink.py), after which Chromium no longer finds them: every colour bar
  // drawn before the change went blank. Each change re-points them at the new address.
  const rebase = () => {
    const here = location.href.split('#')[0];
    document.querySelectorAll('.js-plotly-plot [style*="url("], .js-plotly-plot [clip-path*="url("]')
      .forEach((el) => {
        for (const attr of ['style', 'clip-path']) {
          const v = el.getAttribute(attr);
          const fixed = v && v.replace(/url\\((['"]?)[^#'")]*#/g, (m, q) => 'url(' + q + here + '#');
          if (fixed && fixed !== v) el.setAttribute(attr, fixed);
        }
      });
  };
  const replaceState = history.replaceState.bind(history);
  history.replaceState = (...args) => { replaceState(...args); rebase(); };
  new MutationObserver(() => {
    bind();
    document.querySelectorAll('.js-plotly-plot').forEach((plot) => { exportBar(plot); phone(plot); });
  }).observe(document.body, {childList: true, subtree: true});
}"""
