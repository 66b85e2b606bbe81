/* The dashboard's activity charts, drawn by the vendored Chart.js (static/vendor/chartjs) from the
   numbers the page embeds (json_script "activity-data"). Nothing is fetched. */
(function () {
  "use strict";
  var source = document.getElementById("activity-data");
  if (!source || typeof Chart === "undefined") { return; }
  var data = JSON.parse(source.textContent);
  var colours = {deposits: "#2e7d32", withdrawals: "#c62828", transfers: "#1565c0", conversions: "#ef6c00"};
  var charts = {};

  function datasets(values) {
    return data.categories.map(function (category) {
      return {label: category, data: values[category].map(Number), backgroundColor: colours[category],
        borderColor: colours[category]};
    });
  }

  charts.counts = new Chart(document.getElementById("activity-counts"), {
    type: "bar",
    data: {labels: data.labels, datasets: datasets(data.counts)},
    options: {animation: false, responsive: true, maintainAspectRatio: false,
      plugins: {title: {display: true, text: "Postings per day"}},
      scales: {x: {stacked: true}, y: {stacked: true, beginAtZero: true, ticks: {precision: 0}}}}
  });

  var holder = document.getElementById("activity-volumes");
  Object.keys(data.volumes).forEach(function (asset) {
    var box = document.createElement("div");
    box.className = "bo-chart bo-chart-small";
    var canvas = document.createElement("canvas");
    canvas.id = "activity-volume-" + asset;
    box.appendChild(canvas);
    holder.appendChild(box);
    charts[asset] = new Chart(canvas, {
      type: "line",
      data: {labels: data.labels, datasets: datasets(data.volumes[asset])},
      options: {animation: false, responsive: true, maintainAspectRatio: false,
        plugins: {title: {display: true, text: "Volume per day, " + asset}},
        scales: {y: {beginAtZero: true}}}
    });
  });
  window.backofficeCharts = charts;  // for the browser tests
})();
