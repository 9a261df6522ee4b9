// The checkout widget for a shop's page, in one script:
//
//   <script type="module" src="https://checkout.example/checkout.js"></script>
//   <div data-checkout-session="cs_…"></div>
//
// A widget is mounted into every element with `data-checkout-session`; `Checkout.mount(element,
// { session: "cs_…" })` mounts one later. The element hears `checkout:paid` (detail: the
// receipt) and `checkout:declined` (detail: the problem). Styles, code and API all come from
// the origin of this script; the widget's rules are scoped to it and leave the page's alone.
const here = (file) => new URL(file, import.meta.url).href;

const style = document.createElement("link");
style.rel = "stylesheet";
style.href = here("style.css");
document.head.append(style);

const widget = await import(here("checkout-frontend.js"));
await widget.default({ module_or_path: here("checkout-frontend_bg.wasm") });

window.Checkout = Object.freeze({
  mount(element, { session }) {
    widget.mount(element, session);
  },
});
document.dispatchEvent(new CustomEvent("checkout:ready"));
