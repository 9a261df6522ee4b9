// The checkout for a shop's page, in one script (a classic script or a module, either works):
//
//   <div data-checkout-session="cs_…"></div>
//   <script src="https://checkout.example/v1/checkout.js"></script>
//
// Every element with `data-checkout-session` (now, or added later) gets the payment page of its
// session in a frame of the checkout's own origin: the shopper's credential, key and balance
// stay there, never in this page. `Checkout.mount(element, { session, locale?, timeout? })` does
// the same for one element and resolves to `{ unmount() }` once the frame is ready (or has
// failed: `timeout` ms, 20 s unless given, without a word from it). The element hears, bubbling:
// `checkout:ready`, `checkout:paid` ({payment_id, amount, status}), `checkout:declined` ({code}),
// `checkout:error` ({code}: the session is unknown, or the frame did not load).
(function () {
  "use strict";
  if (window.Checkout) return;
  // The checkout's origin, written in by the server that sent this script: never read from
  // the page, where any script element may be named like this one.
  const checkout = "__CHECKOUT_ORIGIN__";
  const EVENTS = ["checkout:ready", "checkout:paid", "checkout:declined", "checkout:error"];
  // How long a frame may take to say it is ready before the element hears `checkout:error`
  // (a page on an origin the shop did not register gets a frame the browser refuses to fill).
  const READY_WITHIN_MS = 20000;
  const mounted = new WeakMap();

  function tell(element, name, detail) {
    element.dispatchEvent(new CustomEvent(name, { detail, bubbles: true, composed: true }));
  }

  // Only what the events are documented to carry leaves the frame's message.
  function detailOf(name, detail) {
    const d = detail && typeof detail === "object" ? detail : {};
    if (name === "checkout:paid") {
      return { payment_id: String(d.payment_id), amount: Number(d.amount), status: String(d.status) };
    }
    if (name === "checkout:declined" || name === "checkout:error") return { code: String(d.code) };
    return {};
  }

  function mount(element, options) {
    if (!(element instanceof Element)) throw new TypeError("Checkout.mount: an element");
    const session = options && options.session;
    if (typeof session !== "string" || !/^cs_[0-9a-f]{32}$/.test(session)) {
      throw new TypeError("Checkout.mount: { session: \"cs_…\" }");
    }
    const known = mounted.get(element);
    if (known) return known.ready;

    const frame = document.createElement("iframe");
    const src = new URL(`/pay/${session}`, checkout);
    src.searchParams.set("parent", location.origin);
    if (options.locale) src.searchParams.set("locale", String(options.locale));
    frame.src = src.href;
    frame.title = "Оплата заказа";
    frame.setAttribute("allow", "payment");
    frame.style.cssText = "border:0;width:100%;display:block;height:420px;overflow:hidden;";
    frame.setAttribute("scrolling", "no");

    let settle;
    const ready = new Promise((resolve) => (settle = resolve));
    const handle = { unmount };
    const within = Number(options.timeout) > 0 ? Number(options.timeout) : READY_WITHIN_MS;
    const timer = setTimeout(() => {
      settle(handle);
      tell(element, "checkout:error", { code: "frame_unavailable" });
    }, within);

    function onMessage(event) {
      // From this frame only, and from the checkout's origin only.
      if (event.source !== frame.contentWindow || event.origin !== checkout) return;
      const message = event.data;
      if (!message || typeof message.type !== "string") return;
      if (message.type === "checkout:resize") {
        const height = Number(message.height);
        if (height > 0 && height < 10000) frame.style.height = `${Math.ceil(height)}px`;
        return;
      }
      if (!EVENTS.includes(message.type)) return;
      if (message.type === "checkout:ready" || message.type === "checkout:error") {
        clearTimeout(timer);
        settle(handle);
      }
      tell(element, message.type, detailOf(message.type, message.detail));
    }

    function unmount() {
      clearTimeout(timer);
      window.removeEventListener("message", onMessage);
      frame.remove();
      mounted.delete(element);
    }

    window.addEventListener("message", onMessage);
    element.replaceChildren(frame);
    mounted.set(element, { ready, handle });
    return ready;
  }

  // Whether the parser is past `element` (its content is whole): a node follows it or one of
  // its ancestors, or the document is parsed. An element framed before that would get the rest
  // of its content (a shop's «Загружаем…») beside its frame.
  function parsed(element) {
    if (document.readyState !== "loading") return true;
    for (let node = element; node; node = node.parentNode) if (node.nextSibling) return true;
    return false;
  }

  // Elements found while their content was still being parsed, framed once it is.
  const unparsed = new Set();

  function mountAll(root) {
    const found = root.matches && root.matches("[data-checkout-session]") ? [root] : [];
    if (root.querySelectorAll) found.push(...root.querySelectorAll("[data-checkout-session]"));
    for (const element of found) {
      if (mounted.has(element)) {
        unparsed.delete(element); // mounted meanwhile by `Checkout.mount`
        continue;
      }
      if (!parsed(element)) {
        unparsed.add(element);
        continue;
      }
      unparsed.delete(element);
      try {
        mount(element, { session: element.dataset.checkoutSession });
      } catch (_) {
        tell(element, "checkout:error", { code: "invalid_session" });
      }
    }
  }

  window.Checkout = Object.freeze({ mount });
  // Every element gets its frame as soon as the parser is past it: the frame loads while the
  // rest of the shop's page is still coming (this script in the page's <head>, `async`, is the
  // earliest). Elements added later get theirs as they come.
  mountAll(document);
  new MutationObserver((changes) => {
    for (const element of unparsed) {
      if (element.isConnected) mountAll(element);
      else unparsed.delete(element);
    }
    for (const change of changes) for (const node of change.addedNodes) mountAll(node);
  }).observe(document, { childList: true, subtree: true });
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", () => mountAll(document));
  }
})();
